"""Pre-routing behind one interface: which tier each prompt goes to for given load fractions.

Two routers, the same knobs (N load fractions per tier, calibrated on the same prompts: the whole profile,
or a re-weighted mix's resampled rows):

- ``ladder``: one difficulty score ``d`` per prompt (:mod:`boute.quality.router`),
  cut at thresholds ``t`` that are calibration quantiles; tier k serves ``t[k-1] < d <= t[k]``.
- ``multi``: each tier's predicted correctness ``p_k`` (:mod:`boute.quality.multi`);
  tier(x) = argmax_k p_k(x) - lambda_k with the prices ``lambda = prices_for_shares(p_cal, fractions)``.

A :class:`PreRouting` holds what does not depend on the held-out set (every profile row's score or
predictions); :meth:`PreRouting.bind` prepares it for one held-out set and calibration (a re-weighted
quality model binds it again) and gives a :class:`PreRouter`, which the quality model asks for a policy's
held-out sums (:meth:`PreRouter.held_out`) and for the tier of any profile row (:meth:`PreRouter.assign`).
The ladder keeps its O(N log n) path (held-out queries sorted by score, cumulative sums); the multi router
routes the held-out rows (O(n N)) under prices that cost a few milliseconds to find, memoised per
fraction vector.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Routed:
    """A pre-route policy on the held-out queries: sums of the answering tiers' scores and squared scores,
    each tier's share, and the cut the plan records (``thresholds`` for the ladder, ``prices`` for multi)."""

    total: float
    total_sq: float
    shares: np.ndarray
    thresholds: list[float]
    prices: np.ndarray | None = None


class PreRouter(Protocol):
    """A pre-routing bound to one held-out set and calibration (module doc)."""

    def held_out(self, f: list[float]) -> Routed: ...

    def assign(self, rows: np.ndarray, f: list[float]) -> np.ndarray: ...


class PreRouting(Protocol):
    """Every profile row's routing inputs, independent of the held-out set."""

    @property
    def kind(self) -> str: ...

    def bind(self, test_index: np.ndarray, test_scores: np.ndarray, calibration: np.ndarray) -> PreRouter: ...


# ---------------------------------------------------------------------------------------------- ladder
def cum_index(f: list[float], m: int) -> list[int]:
    """Calibration sample counts at the cumulative fractions (all but the last, which is m)."""
    out, c = [], 0.0
    for x in f[:-1]:
        c += x
        out.append(min(max(round(c * m), 0), m))
    return out


def midpoints(sorted_scores: np.ndarray, descending: bool = False) -> list[float]:
    """``mid[k]``: a threshold with exactly k calibration scores on the near side (k = 0..m; ends infinite).

    Works for ascending (preroute, ``score <= t``) and descending (cascade, ``score >= t``) order alike.
    """
    inner = ((sorted_scores[:-1] + sorted_scores[1:]) / 2.0).tolist()
    first, last = (math.inf, -math.inf) if descending else (-math.inf, math.inf)
    return [first, *inner, last]


def cut(mid: Sequence[float], f: list[float]) -> list[float]:
    """The cut points for fractions ``f`` among reference midpoints ``mid``: the rule itself, one copy."""
    return [float(mid[k]) for k in cum_index(f, len(mid) - 1)]


@dataclass(frozen=True)
class LadderRouting:
    """The ladder: every profile row's difficulty score (``QualityModel.route_all``)."""

    scores: np.ndarray
    kind: str = "ladder"

    def bind(self, test_index: np.ndarray, test_scores: np.ndarray, calibration: np.ndarray) -> Ladder:
        return Ladder(self.scores, test_index, test_scores, calibration)


class Ladder:
    """Thresholds on one score, held-out queries sorted by it with per-tier cumulative sums: a policy is N
    ``bisect`` calls and lookups (the optimiser asks thousands of times)."""

    def __init__(self, scores: np.ndarray, test_index: np.ndarray, q: np.ndarray, calibration: np.ndarray) -> None:
        self.scores = scores
        self.cal = np.sort(scores[calibration])
        self.cal_mid = midpoints(self.cal)
        d = scores[test_index]
        order = np.argsort(d, kind="stable")
        self.n = len(d)
        self.d_sorted = d[order].tolist()  # Python lists: bisect + indexing beat numpy calls on scalars
        # cum[k][j] = sum of tier k's scores over the j easiest held-out queries (cum2: squared scores)
        cum = np.zeros((q.shape[1], self.n + 1))
        cum[:, 1:] = np.cumsum(q[order].T, axis=1)
        cum2 = np.zeros((q.shape[1], self.n + 1))
        cum2[:, 1:] = np.cumsum((q[order] ** 2).T, axis=1)
        self.cum, self.cum2 = cum.tolist(), cum2.tolist()

    def thresholds(self, f: list[float]) -> list[float]:
        return cut(self.cal_mid, f)

    def fractions_for(self, thresholds: np.ndarray) -> np.ndarray:
        """Share of the calibration queries each tier gets under these thresholds."""
        c = np.searchsorted(self.cal, thresholds, side="right") / self.cal.shape[0]
        return np.diff(np.concatenate([[0.0], c, [1.0]]))

    def at(self, t: list[float]) -> Routed:
        n = self.n
        b = [0, *(bisect.bisect_right(self.d_sorted, x) for x in t), n]
        total = sum(c[b[k + 1]] - c[b[k]] for k, c in enumerate(self.cum))
        total_sq = sum(c[b[k + 1]] - c[b[k]] for k, c in enumerate(self.cum2))
        shares = np.array([(b[k + 1] - b[k]) / n for k in range(len(t) + 1)])
        return Routed(total, total_sq, shares, t)

    def held_out(self, f: list[float]) -> Routed:
        return self.at(self.thresholds(f))

    def assign(self, rows: np.ndarray, f: list[float]) -> np.ndarray:
        return np.searchsorted(np.array(self.thresholds(f)), self.scores[rows], side="left")


# ----------------------------------------------------------------------------------------------- multi
@dataclass(frozen=True)
class MultiRouting:
    """The multi router: every profile row's predicted correctness per tier, (n_all, N)."""

    predicted: np.ndarray
    kind: str = "multi"

    def bind(self, test_index: np.ndarray, test_scores: np.ndarray, calibration: np.ndarray) -> Multi:
        return Multi(self.predicted, test_index, test_scores, calibration)


@dataclass
class Multi:
    """argmax_k p_k - lambda_k with prices cut on the calibration rows' predictions (module doc)."""

    predicted: np.ndarray
    test_index: np.ndarray
    q: np.ndarray
    calibration: np.ndarray
    _prices: dict[tuple[int, ...], np.ndarray] = field(default_factory=dict, repr=False)
    _routed: dict[tuple[int, ...], Routed] = field(default_factory=dict, repr=False)
    _last: np.ndarray | None = field(default=None, repr=False)

    def _key(self, f: list[float]) -> tuple[int, ...]:
        from boute.quality.multi import share_counts

        return tuple(share_counts(f, len(self.calibration)).tolist())

    def prices(self, f: list[float]) -> np.ndarray:
        """:func:`boute.quality.multi.prices_for_shares` on the calibration rows, memoised on the prompt counts
        the fractions ask of each tier (what the prices depend on), and descending from the last prices found:
        a search asks for nearby policies in a row (the screen's bisection), so that takes one or two sweeps
        instead of three or four (0.13 against 0.31 ms of CPU on RouterBench's 3 tiers). The calibration
        prompts' assignment, and so every held-out figure, is the same from any start (exact counts: module
        doc of :mod:`boute.quality.multi`)."""
        return self._prices_at(self._key(f), f)

    def _prices_at(self, key: tuple[int, ...], f: list[float]) -> np.ndarray:
        from boute.quality.multi import prices_for_shares

        if key not in self._prices:
            if len(self._prices) > 100_000:
                self._prices.clear()
            self._prices[key] = self._last = prices_for_shares(self.predicted[self.calibration], f, self._last)
        return self._prices[key]

    def held_out(self, f: list[float]) -> Routed:
        from boute.quality.multi import route

        key = self._key(f)
        if key not in self._routed:
            if len(self._routed) > 100_000:
                self._routed.clear()
            lam = self._prices_at(key, f)
            tier = route(self.predicted[self.test_index], lam)
            y = self.q[np.arange(len(tier)), tier]
            shares = np.bincount(tier, minlength=self.q.shape[1]) / max(len(tier), 1)
            self._routed[key] = Routed(float(y.sum()), float((y**2).sum()), shares, [], lam)
        return self._routed[key]

    def assign(self, rows: np.ndarray, f: list[float]) -> np.ndarray:
        from boute.quality.multi import route

        return route(self.predicted[rows], self.prices(f))

    def fractions_for(self, prices: np.ndarray) -> np.ndarray:
        """Share of calibration prompts each tier gets under explicit ``prices`` (a running plan's, under this
        model's mix)."""
        from boute.quality.multi import route

        tier = route(self.predicted[self.calibration], prices)
        return np.bincount(tier, minlength=self.predicted.shape[1]) / max(len(tier), 1)
