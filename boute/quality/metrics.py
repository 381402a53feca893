"""RouteLLM's router metrics on a quality model: quality vs share of large-model calls, APGR, CPT(x%).

For a small/large pair (the first and last tier) with held-out qualities ``q_s < q_l``:

- PGR(policy) = (quality - q_s) / (q_l - q_s): the share of the quality gap the policy recovers.
- APGR = area under PGR vs the share of large-model calls over [0, 1] (trapezoid on a fine grid).
  Random routing scores 0.5 by construction.
- CPT(x%) = the smallest share of large-model calls at which PGR reaches x% (linear interpolation
  between grid points); random routing needs x%.

Curves: the learned router (preroute), the cascade (x = share of queries that reach the large model,
which for two tiers is also its share of final answers), random routing (the exact expectation
``q_s + s (q_l - q_s)``) and the oracle, which knows every query's outcome and sends to the large model
the queries where it gains most, first, never the ones where it loses (so its curve rises and then
stays flat).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from boute.quality.policy_quality import QualityModel
from boute.specs.targets import meets_floor


def pair_fractions(n_tiers: int, large_share: float) -> np.ndarray:
    f = np.zeros(n_tiers)
    f[0], f[-1] = 1.0 - large_share, large_share
    return f


def oracle_curve(small: np.ndarray, large: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Best achievable quality when at most ``share`` of queries go to the large model."""
    gain = np.sort(np.clip(large - small, 0.0, None))[::-1]
    cum = np.concatenate([[0.0], np.cumsum(gain)])
    k = np.floor(np.asarray(shares) * small.shape[0] + 1e-9).astype(int)
    return (small.sum() + cum[np.clip(k, 0, small.shape[0])]) / small.shape[0]


def random_curve(q_small: float, q_large: float, shares: np.ndarray) -> np.ndarray:
    return q_small + np.asarray(shares) * (q_large - q_small)


def policy_curve(qm: QualityModel, mode: str, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(realised large-model share, quality) for each requested large share in ``grid``."""
    xs, ys = np.empty(len(grid)), np.empty(len(grid))
    for i, s in enumerate(grid):
        f = pair_fractions(len(qm.tiers), float(s))
        r = qm.preroute(f) if mode == "preroute" else qm.cascade(f)
        xs[i], ys[i] = r.visits[-1], r.quality
    order = np.argsort(xs, kind="stable")
    return xs[order], ys[order]


def apgr(shares: np.ndarray, pgr: np.ndarray) -> float:
    x = np.concatenate([[0.0], shares, [1.0]]) if shares[0] > 0 or shares[-1] < 1 else shares
    y = np.interp(x, shares, pgr)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2.0))


def cpt(shares: np.ndarray, pgr: np.ndarray, target: float) -> float | None:
    """Smallest large-model share where PGR >= target (interpolated); None if never reached."""
    hit = np.nonzero(pgr >= target - 1e-12)[0]
    if hit.size == 0:
        return None
    i = int(hit[0])
    if i == 0:
        return float(shares[0])
    x0, x1, y0, y1 = shares[i - 1], shares[i], pgr[i - 1], pgr[i]
    return float(x0 + (target - y0) * (x1 - x0) / (y1 - y0)) if y1 > y0 else float(x1)


def summarise(shares: np.ndarray, quality: np.ndarray, q_small: float, q_large: float) -> dict[str, float | None]:
    pgr = (quality - q_small) / (q_large - q_small)
    return {"apgr": apgr(shares, pgr), "cpt50": cpt(shares, pgr, 0.5), "cpt80": cpt(shares, pgr, 0.8)}


def evaluate(qm: QualityModel, *, points: int = 101, modes: tuple[str, ...] = ("preroute",)) -> dict[str, Any]:
    """Curves and summary numbers for the first vs the last tier on the held-out queries."""
    grid = np.linspace(0.0, 1.0, points)
    small, large = qm.test_scores[:, 0], qm.test_scores[:, -1]
    qs, ql = float(small.mean()), float(large.mean())
    if not ql > qs:
        from boute.errors import BouteError

        raise BouteError(f"the last tier ({ql:.3f}) is not better than the first ({qs:.3f}): no gap to recover")
    out: dict[str, Any] = {
        "tiers": list(qm.tiers),
        "n_test": qm.n_test,
        "quality_small": qs,
        "quality_large": ql,
        "curves": {
            "random": {"share": grid.tolist(), "quality": random_curve(qs, ql, grid).tolist()},
            "oracle": {"share": grid.tolist(), "quality": oracle_curve(small, large, grid).tolist()},
        },
        "summary": {
            "random": summarise(grid, random_curve(qs, ql, grid), qs, ql),
            "oracle": summarise(grid, oracle_curve(small, large, grid), qs, ql),
        },
    }
    for mode in modes:
        x, y = policy_curve(qm, mode, grid)
        name = "router" if mode == "preroute" else "cascade"
        out["curves"][name] = {"share": x.tolist(), "quality": y.tolist()}
        out["summary"][name] = summarise(x, y, qs, ql)
    return out


def at_shares(result: dict[str, Any], shares: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)) -> dict[str, dict[str, float]]:
    """Each curve's quality interpolated at the given large-model shares (the issue's 20/40/60/80%)."""
    return {
        name: {f"{s:.0%}": float(np.interp(s, c["share"], c["quality"])) for s in shares}
        for name, c in result["curves"].items()
    }


def share_for_floor(curve: dict[str, list[float]], floor: float) -> float | None:
    """Smallest large-model share whose quality reaches ``floor`` on a curve, or None."""
    x, y = np.asarray(curve["share"]), np.asarray(curve["quality"])
    hit = np.nonzero(meets_floor(y, floor))[0]
    return float(x[hit[0]]) if hit.size else None
