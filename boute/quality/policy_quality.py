"""What a routing policy does to quality, measured on held-out queries, fast enough for the optimiser.

The optimiser encodes a policy as load fractions per tier and asks for its quality thousands of times.
Everything that does not depend on the fractions is done once in the constructor: held-out queries are
sorted by the router's difficulty score (and, for cascades, by the verifier's confidence) and each tier's
scores are turned into cumulative sums in that order. A policy is then a handful of ``searchsorted`` calls
and lookups: O(tiers * log n), microseconds for 10k queries.

Fractions and thresholds map to each other by *calibrated quantiles*: the thresholds are quantiles of
the router score over the whole profile (what the router service sees in production: it applies the
thresholds to live prompts), and the held-out queries then show the shares a tier *actually* gets, which
can differ from the requested fractions by sampling noise. That difference is reported, not hidden.

Preroute: the router score ``d`` orders queries; tier k serves ``t[k-1] < d <= t[k]`` (``t[-1] = -inf``,
``t[N-1] = +inf``). That is the ladder; a model built with ``router_kind="multi"`` pre-routes by the multi
router instead (tier = argmax_k p_k - lambda_k, prices cut on the same calibration prompts), behind the one
interface of :mod:`boute.quality.preroute`. Cascade: tier 0 answers every query; the verifier's confidence ``v_k`` in tier k's
answer accepts it when ``v_k >= theta_k``, otherwise the query moves to tier k+1 (each hop costs one judge
call and one more generation); the last tier always answers.

Every policy result carries the held-out mean, its standard error and a one-sided lower confidence bound
(:mod:`boute.quality.confidence`: ``mean - t * se``, from running sums of scores and squared scores, so
as cheap as the mean). ``PolicyResult.quality`` is the figure the quality floor is held against
(:meth:`boute.specs.targets.Targets.mask`): the mean, or the bound for a model built with
``hold="bound"`` (a scenario's ``targets.floor_on: bound``, ``boute optimize --quality-confidence``).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from boute.quality.confidence import DEFAULT_LEVEL, lower_bound, mean_and_se
from boute.quality.preroute import LadderRouting, PreRouting, cum_index, midpoints
from boute.quality.shares import cascade_visits, check_fractions, systematic_resample
from boute.specs.plan import ROUTING_MODES

#: what scores a cascade's answers: the offline verifier, or an LLM judge whose scores the profile recorded
JUDGES = ("verifier", "llm")
#: which figure of a policy the quality floor holds on: the held-out mean or its lower confidence bound
HOLDS = ("mean", "bound")


@dataclass(frozen=True)
class PolicyResult:
    quality: float  # expected quality on held-out queries, profile scale [0, 1]
    shares: np.ndarray  # fraction of queries whose final answer comes from each tier (sums to 1)
    visits: np.ndarray  # fraction of queries each tier processes (== shares for preroute)
    judge_calls: float  # judge calls per query (0 for preroute)
    thresholds: np.ndarray  # score thresholds equivalent to the fractions (len n_tiers - 1; empty for multi)
    #: held-out mean quality (``quality`` is this, or ``bound`` when the floor holds on the bound)
    mean: float | None = None
    se: float = 0.0  # standard error of ``mean``
    bound: float | None = None  # one-sided lower confidence bound at ``level``
    level: float = DEFAULT_LEVEL
    #: a multi router's prices equivalent to the fractions (len n_tiers; None for the ladder and cascades)
    prices: np.ndarray | None = None

    def summary(self) -> dict[str, float | None]:
        """The quality figures a plan records: mean, standard error, lower bound and its level."""
        return {"mean": self.mean, "se": self.se, "bound": self.bound, "level": self.level}


@dataclass(frozen=True)
class CascadeJudge:
    """The judge whose scores a cascade's thresholds are cut on; a plan names it, since thresholds mean
    nothing on another judge's scores.

    ``verifier``: the offline verifier (its file: ``QualityModel.info["verifier_path"]``). ``llm``: an LLM
    judge whose score of every profile answer ``boute profile quality --cascade-judge`` recorded; ``model``
    is the model name it served (the plan names it, the gateway's requests must carry it) and
    ``latency_s`` its mean seconds per call when profiled, what a judged hop costs in the simulator.
    """

    kind: str = "verifier"
    model: str | None = None
    latency_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in JUDGES:
            raise ValueError(f"judge must be one of {JUDGES}, got {self.kind!r}")
        if self.kind == "llm" and (not self.model or self.latency_s is None or not self.latency_s >= 0):
            raise ValueError("an llm judge needs its model name and its latency (seconds >= 0)")


@dataclass
class QualityModel:
    """Held-out quality of preroute and cascade policies over ``tiers`` (small -> large).

    ``test_scores`` (n_test, N): each tier's normalised quality per held-out query. ``route_test`` /
    ``route_all``: router difficulty on held-out / all profile queries (``all`` calibrates thresholds and
    routes workload requests by ``prompt_index``). ``cascade_scores`` lazily returns the ``judge``'s score
    of each non-final tier's answer (the verifier's confidence, or a recorded LLM judge's rating), (n_all,
    N-1), for all profile queries: cascade thresholds are cut on them.
    """

    tiers: tuple[str, ...]
    test_scores: np.ndarray
    test_index: np.ndarray
    route_all: np.ndarray
    cascade_scores: Callable[[], np.ndarray] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    #: profile rows the thresholds are calibrated on (with repeats: a re-weighted mix); None: every row once
    calibration: np.ndarray | None = None
    #: relative weight of each profile row in the traffic (None: the profile's own mix, every row alike)
    row_weights: np.ndarray | None = None
    #: level of the lower confidence bound every policy result states
    confidence: float = DEFAULT_LEVEL
    #: the figure ``PolicyResult.quality`` is (the floor holds on it): ``mean`` or ``bound``
    hold: str = "mean"
    #: whose scores ``cascade_scores`` are (the verifier's, or a recorded LLM judge's)
    judge: CascadeJudge = CascadeJudge()
    #: how pre-route policies split prompts (:mod:`boute.quality.preroute`); None: the ladder on ``route_all``
    prerouting: PreRouting | None = None

    def __post_init__(self) -> None:
        n_tiers = len(self.tiers)
        q = np.asarray(self.test_scores, dtype=np.float64)
        if q.ndim != 2 or q.shape[1] != n_tiers:
            raise ValueError(f"test_scores must be (n, {n_tiers}), got {q.shape}")
        if self.hold not in HOLDS:
            raise ValueError(f"hold must be one of {HOLDS}, got {self.hold!r}")
        lower_bound(0.0, 0.0, 2, self.confidence)  # checks the level
        self.test_scores = q
        self.n_test = q.shape[0]
        self.tier_quality = q.mean(axis=0)
        self._cal_rows = np.arange(len(self.route_all)) if self.calibration is None else self.calibration
        # the ladder on ``route_all`` always: its thresholds are what ``thresholds_for_fractions`` and the
        # re-plan loop read; pre-route policies come from ``prerouting`` (the ladder itself by default)
        self._ladder = LadderRouting(self.route_all).bind(self.test_index, q, self._cal_rows)
        self._pre = (
            self._ladder if self.prerouting is None else self.prerouting.bind(self.test_index, q, self._cal_rows)
        )
        self._casc: dict[str, Any] | None = None

    @property
    def router_kind(self) -> str:
        """``ladder`` or ``multi``: what splits pre-routed prompts (:mod:`boute.quality.preroute`), and so the
        plan's ``routing.scorer`` (:mod:`boute.quality.router_kinds`)."""
        return "ladder" if self.prerouting is None else self.prerouting.kind

    def _result(
        self,
        total: float,
        total_sq: float,
        shares: np.ndarray,
        visits: np.ndarray,
        judge: float,
        t: ArrayLike,
        prices: np.ndarray | None = None,
    ) -> PolicyResult:
        """A policy result from the sums of the held-out queries' scores and squared scores."""
        mean, se = mean_and_se(total, total_sq, self.n_test)
        bound = lower_bound(mean, se, self.n_test, self.confidence)
        held = bound if self.hold == "bound" else mean
        return PolicyResult(held, shares, visits, judge, np.asarray(t), mean, se, bound, self.confidence, prices)

    def with_confidence(self, level: float, hold: str = "mean") -> QualityModel:
        """This model with bounds at ``level``, the floor holding on ``hold`` (``mean`` or ``bound``)."""
        out = dataclasses.replace(self, confidence=float(level), hold=hold)
        out._casc = self._casc  # the verifier's scores do not depend on either
        return out

    # ------------------------------------------------------------------------------- preroute
    def thresholds_for_fractions(self, fractions: ArrayLike) -> np.ndarray:
        """The ladder's thresholds for these fractions (on ``route_all``, whatever this model pre-routes with)."""
        return np.array(self._ladder.thresholds(check_fractions(fractions, len(self.tiers))))

    def fractions_for_thresholds(self, thresholds: ArrayLike) -> np.ndarray:
        """Share of calibration (all profile) queries each tier gets under these ladder thresholds."""
        return self._ladder.fractions_for(np.asarray(thresholds, dtype=np.float64))

    def fractions_for_prices(self, prices: ArrayLike) -> np.ndarray:
        """Share of calibration queries each tier gets under a multi router's ``prices`` (ValueError for a model
        that pre-routes with the ladder)."""
        from boute.quality.preroute import Multi

        if not isinstance(self._pre, Multi):
            raise ValueError("this quality model pre-routes with the ladder, not prices")
        return self._pre.fractions_for(np.asarray(prices, dtype=np.float64))

    def preroute(self, fractions: ArrayLike) -> PolicyResult:
        """Quality when the fractions split the held-out queries as this model's pre-router does (the ladder:
        tier k serves the queries whose difficulty falls in its quantile band; multi: argmax p_k - lambda_k)."""
        r = self._pre.held_out(check_fractions(fractions, len(self.tiers)))
        return self._result(r.total, r.total_sq, r.shares, r.shares, 0.0, r.thresholds, r.prices)

    def preroute_thresholds(self, thresholds: ArrayLike) -> PolicyResult:
        """The ladder at explicit thresholds."""
        r = self._ladder.at(np.maximum.accumulate(np.asarray(thresholds, dtype=np.float64)).tolist())
        return self._result(r.total, r.total_sq, r.shares, r.shares, 0.0, r.thresholds)

    # ------------------------------------------------------------------------------ mix
    def reweighted(self, row_weights: ArrayLike) -> QualityModel:
        """This model under another traffic mix: profile row ``i`` weighs ``row_weights[i]``.

        Held-out queries and calibration rows are resampled to the weights (systematic resampling: the
        same sizes, deterministic), so every policy method works unchanged: the quality is the mix's
        (harder traffic scores lower), and fractions stay *load* shares because the thresholds are cut on
        the re-weighted calibration rows (they move with the mix, the shares do not).
        """
        w = np.asarray(row_weights, dtype=np.float64).reshape(-1)
        if w.shape != self.route_all.shape:
            raise ValueError(f"row_weights: expected {self.route_all.shape[0]} values, got {w.shape[0]}")
        if self.calibration is not None or self.row_weights is not None:
            raise ValueError("reweighted: this model is already re-weighted; re-weight the profile's own model")
        pick = systematic_resample(w[self.test_index], self.n_test)
        prep = self._casc
        casc = self.cascade_scores if prep is None else (lambda: prep["v_all"])  # computed once, shared
        return QualityModel(
            self.tiers,
            self.test_scores[pick],
            self.test_index[pick],
            self.route_all,
            casc,
            dict(self.info),
            calibration=systematic_resample(w, len(w)),
            row_weights=w,
            confidence=self.confidence,
            hold=self.hold,
            judge=self.judge,
            prerouting=self.prerouting,
        )

    # -------------------------------------------------------------------------------- cascade
    def _cascade_prep(self) -> dict[str, Any]:
        if self._casc is None:
            if self.cascade_scores is None:
                from boute.errors import BouteError

                raise BouteError("cascade mode needs a judge's scores: this quality model has none")
            v_all = np.asarray(self.cascade_scores(), dtype=np.float64).reshape(len(self.route_all), -1)
            v = v_all[self.test_index]
            v_cal = v_all[self._cal_rows]
            prep: dict[str, Any] = {"v_all": v_all, "v": v, "v_cal": v_cal}
            if len(self.tiers) == 2:  # fast path: held-out queries ordered by confidence, descending
                order = np.argsort(-v[:, 0], kind="stable")
                prep["neg_v"] = (-v[order, 0]).tolist()
                prep["mid_desc"] = midpoints(np.sort(v_cal[:, 0])[::-1], descending=True)
                q = self.test_scores[order]
                prep["c0"] = np.concatenate([[0.0], np.cumsum(q[:, 0])]).tolist()
                prep["c1"] = np.concatenate([[0.0], np.cumsum(q[:, 1])]).tolist()
                prep["c0sq"] = np.concatenate([[0.0], np.cumsum(q[:, 0] ** 2)]).tolist()
                prep["c1sq"] = np.concatenate([[0.0], np.cumsum(q[:, 1] ** 2)]).tolist()
            self._casc = prep
        return self._casc

    def cascade_thresholds(self, fractions: ArrayLike) -> np.ndarray:
        """theta_k such that a ``fractions[k]`` share of all calibration queries is accepted at tier k."""
        f = check_fractions(fractions, len(self.tiers))
        v = self._cascade_prep()["v_cal"]
        m = v.shape[0]
        remaining = np.ones(m, dtype=bool)
        theta = np.full(len(self.tiers) - 1, np.inf)
        for k in range(len(self.tiers) - 1):
            pool = -v[remaining, k]  # ascending in -v: the a most confident come first
            a = round(f[k] * m)
            if a >= pool.shape[0]:
                theta[k] = -np.inf
            elif a > 0:
                part = np.partition(pool, (a - 1, a))  # O(m), not a sort: this runs per evaluation
                theta[k] = -(part[a - 1] + part[a]) / 2.0
            remaining &= ~(v[:, k] >= theta[k])
        return theta

    def cascade(self, fractions: ArrayLike) -> PolicyResult:
        """Quality and extra work when ``fractions[k]`` of queries get their answer accepted at tier k."""
        if len(self.tiers) == 2:
            f = check_fractions(fractions, 2)
            mid = self._cascade_prep()["mid_desc"]
            return self.cascade_at([mid[cum_index(f, len(mid) - 1)[0]]])
        return self.cascade_at(self.cascade_thresholds(fractions))

    def cascade_at(self, theta: ArrayLike) -> PolicyResult:
        """Cascade with explicit acceptance thresholds on the verifier's confidence."""
        prep = self._cascade_prep()
        n, n_tiers = self.n_test, len(self.tiers)
        if n_tiers == 2:
            th = float(np.asarray(theta, dtype=np.float64).reshape(-1)[0])
            a = bisect.bisect_right(prep["neg_v"], -th)  # number of held-out queries with v >= theta
            total = prep["c0"][a] + (prep["c1"][-1] - prep["c1"][a])
            total_sq = prep["c0sq"][a] + (prep["c1sq"][-1] - prep["c1sq"][a])
            shares = np.array([a / n, 1.0 - a / n])
            visits = np.array([1.0, 1.0 - a / n])
            return self._result(total, total_sq, shares, visits, 1.0, [th])
        theta = np.asarray(theta, dtype=np.float64)
        final = self._cascade_route(prep["v"], theta)  # general N: O(n * N) with masks
        shares = np.bincount(final, minlength=n_tiers) / n
        y = self.test_scores[np.arange(n), final]
        visits = cascade_visits(shares)
        return self._result(float(y.sum()), float((y**2).sum()), shares, visits, float(visits[:-1].sum()), theta)

    @staticmethod
    def _cascade_route(v: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """Final tier per query: the first tier whose answer clears its threshold (else the last)."""
        accept = v >= theta[None, :]
        accept = np.hstack([accept, np.ones((v.shape[0], 1), dtype=bool)])
        return np.argmax(accept, axis=1)

    # -------------------------------------------------------------------------- workload
    def assign(
        self, prompt_index: np.ndarray, fractions: ArrayLike, mode: str = "preroute", seed: int = 0
    ) -> np.ndarray:
        """Tier per request (cascade: the tier whose answer is accepted, i.e. the last one reached).

        Requests carrying a profile prompt (``prompt_index >= 0``) are routed by its score (or, multi, its
        predicted correctness under the prices), exactly as the router service would; the others (-1:
        synthetic lengths) are drawn at random by ``fractions``.
        """
        if mode not in ROUTING_MODES:
            raise ValueError(f"mode must be one of {ROUTING_MODES}, got '{mode}'")
        f = check_fractions(fractions, len(self.tiers))
        idx = np.asarray(prompt_index, dtype=np.int64)
        if idx.size and idx.max() >= len(self.route_all):
            raise ValueError(f"prompt_index {int(idx.max())} is beyond the profile ({len(self.route_all)} prompts)")
        out = np.empty(idx.shape[0], dtype=np.int64)
        known = idx >= 0
        if mode == "preroute":
            out[known] = self._pre.assign(idx[known], f)
        else:
            v = self._cascade_prep()["v_all"]
            out[known] = self._cascade_route(v[idx[known]], self.cascade_thresholds(f))
        unknown = ~known
        if unknown.any():
            rng = np.random.default_rng(seed)
            out[unknown] = rng.choice(len(self.tiers), size=int(unknown.sum()), p=f)
        return out
