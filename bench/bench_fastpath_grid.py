"""Analytical fast path vs the event simulator over a grid of workload shapes (issue 13).

Grid (boute.sim.agreement): prompt/answer pairs from 60/600 (ratio 0.1) to 2000/28 and 4000/40 (ratio 100),
Poisson and bursty (gamma, cv 2) arrivals, 40/70/95% utilisation, 2- and 3-tier plans. Goal: fast P95
within 15% of the simulated P95 wherever the simulated P95 is under the scenario's cap. Quick mode runs
one point per length pair and tier count (70% load, Poisson) with one seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: each grid point is simulated once per seed (its own arrivals and lengths, one rate) and the fast path is
#: compared with the mean simulated P95: one seed's P95 moves by up to ~15% at bursty prefill-heavy points
SEEDS = (0, 1, 2, 3, 4)


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(sel: list[dict[str, Any]]) -> dict[str, Any]:
        e = np.array([abs(r["error_pct"]) for r in sel if math.isfinite(r["error_pct"])])
        if not len(e):
            return {"points": 0}
        return {
            "points": len(e),
            "median_abs_pct": round(float(np.median(e)), 1),
            "worst_abs_pct": round(float(e.max()), 1),
        }

    under = [r for r in rows if r["under_cap"]]
    return {
        "all": stats(rows),
        "sim_p95_under_cap": stats(under),
        "under_cap_not_flagged": stats([r for r in under if not r["fast_uncertain"]]),
        "flagged_uncertain": sum(bool(r["fast_uncertain"]) for r in rows),
        "within_15pct_under_cap": sum(abs(r["error_pct"]) <= 15 for r in under),
        # how far one seed's simulated P95 strays from the mean over seeds (the reference's own noise)
        "sim_seed_spread_under_cap": stats(
            [{"error_pct": 100.0 * (max(abs(v / r["sim_p95_s"] - 1.0) for v in r["sim_p95_by_seed"]))} for r in under]
        ),
    }


def run(quick: bool) -> dict[str, Any]:
    from boute.sim.agreement import compare, grid

    rows = [compare(p, requests=4000 if quick else 6000, seeds=SEEDS[:1] if quick else SEEDS) for p in grid(quick)]
    return {
        "goal": "fast P95 within 15% of simulated P95 wherever the simulated P95 is under the cap",
        "summary": _summary(rows),
        "points": rows,
    }
