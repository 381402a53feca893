"""The one feasibility rule: what a plan must meet (quality floor, P95 cap, price budget).

Every place that asks "does this plan meet the targets?" (evaluators, the choice of the plan, the
convergence test, confirmations, experiments, benches) asks :meth:`Targets.met_by` or its vectorised twin
:meth:`Targets.mask`, so the tolerances below exist once.

The quality compared with the floor is the policy's ``PolicyResult.quality``: its held-out mean, or, when
the scenario says ``targets.floor_on: bound`` (``boute optimize --quality-confidence``), the one-sided lower
confidence bound on it (:mod:`boute.quality.confidence`). The quality model decides which figure that is,
once, so every caller here compares the same figure with the same floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import numpy as np
from numpy.typing import ArrayLike

#: a quality equal to the floor up to float noise meets it (fractions -> quality is a sum of shares)
QUALITY_EPS = 1e-12
#: a cost within a micro-dollar of the budget is within it (prices are sums of per-GPU prices)
BUDGET_EPS = 1e-6
#: a quality measured on a sample (the live evaluator: one or two hundred answers, standard error ~0.03)
#: meets the floor when the floor is within this many standard errors of the sample mean
QUALITY_SE_TOLERANCE = 2.0


@overload
def meets_floor(quality: float, floor: float) -> bool: ...
@overload
def meets_floor(quality: np.ndarray, floor: float) -> np.ndarray: ...
def meets_floor(quality: float | np.ndarray, floor: float) -> bool | np.ndarray:
    """``quality >= floor`` up to :data:`QUALITY_EPS` (elementwise on an array): the floor half of the
    feasibility rule, for the callers that hold a quality without the other two figures (the screen's
    routing repair, the search's incumbents and acquisitions, the quality curves). A float stays a float:
    the screen's bisection calls this ~25 times per projected plan, and wrapping each scalar in an array
    cost 0.7 us a call against ~50 ns (`python -m timeit`, this machine: 53.7 ns)."""
    return quality >= floor - QUALITY_EPS


@dataclass(frozen=True)
class Targets:
    """Quality floor (profile scale [0, 1]), P95 end-to-end latency cap (s), budget (USD/h)."""

    quality_floor: float
    p95_cap_s: float
    budget: float

    def met_by(self, quality: float, p95: float, cost: float, quality_se: float = 0.0) -> bool:
        """Whether one plan meets all three; ``quality_se`` > 0 for a sampled quality."""
        return bool(self.mask([quality], [p95], [cost], [quality_se])[0])

    def mask(
        self, quality: ArrayLike, p95: ArrayLike, cost: ArrayLike, quality_se: ArrayLike | None = None
    ) -> np.ndarray:
        """:meth:`met_by` over arrays of plans."""
        q = np.asarray(quality, dtype=float)
        if quality_se is not None:
            q = q + QUALITY_SE_TOLERANCE * np.asarray(quality_se, dtype=float)
        return (
            meets_floor(q, self.quality_floor)
            & (np.asarray(p95, dtype=float) <= self.p95_cap_s)
            & (np.asarray(cost, dtype=float) <= self.budget + BUDGET_EPS)
        )

    def violation(self, quality: ArrayLike, p95: ArrayLike, cost: ArrayLike) -> np.ndarray:
        """Relative shortfall: quality below the floor (share of the floor) + log-ratio of P95 over the cap
        + cost over the budget (share of the budget); 0 for a plan that meets all three."""
        q, p, c = (np.asarray(v, dtype=float) for v in (quality, p95, cost))
        fl = max(self.quality_floor, 1e-9)
        return (
            np.maximum(0.0, (self.quality_floor - q) / fl)
            + np.maximum(0.0, np.log(np.maximum(p, 1e-9) / self.p95_cap_s))
            + np.maximum(0.0, (c - self.budget) / self.budget)
        )
