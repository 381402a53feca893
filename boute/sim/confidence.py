"""Where the analytical fast path is unsure: a band on its P95, reported with every fast-path result.

Each :class:`~boute.sim.fastpath.FastResult` carries the band and ``needs_confirmation(cap)``, and
``boute.sim.agreement`` checks them against the simulator. ``boute optimize`` does not gate on the flag:
it confirms every plan it would write with the simulator (:mod:`boute.optimize.confirm`), sure or not;
the band is for users and tools that take fast-path figures on their own.

The bands come from the fast-vs-simulator comparison over the workload-shape grid
(``bench/bench_fastpath_grid.py``, docs/simulator.md): the fast path is a steady-state mean-value model,
so it is weakest near saturation (finite horizons, balancer feedback), when the prefill stage is the
bottleneck (its queue sets the tail), and for bursty arrivals under load (it only sees the inter-arrival
coefficient of variation). Outside those regimes its P95 agreed with the simulator within 8% on that
grid (and within 22% inside them, below the P95 cap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: relative P95 band where no risk factor applies (the grid's typical agreement)
BASE_BAND = 0.15
#: tier utilisation from which the steady-state approximation loosens, and where it is unreliable
HIGH_UTILISATION = 0.85
#: prompt work per second of a replica (at a full chunk's per-token cost) from which the prefill queue
#: dominates the tail (a one-replica 70B tier at 0.58 was 33% optimistic on prefill-heavy traffic)
HIGH_PREFILL = 0.5
#: squared arrival coefficient of variation beyond which bursts matter (Poisson = 1) ...
BURSTY_CA2 = 2.0
#: ... once the tier is at least this loaded
BURSTY_UTILISATION = 0.6


@dataclass(frozen=True)
class Confidence:
    """Relative uncertainty of the fast path's P95 and why."""

    band: float  # the simulator's P95 is expected within p95 x (1 +- band)
    reasons: tuple[str, ...]

    @property
    def uncertain(self) -> bool:
        """True when a risk factor applies: confirm such an evaluation with the simulator."""
        return bool(self.reasons)


def assess(max_utilisation: float, max_prefill_utilisation: float, arrival_cv: float, stable: bool) -> Confidence:
    """The band and reasons for one evaluation (inputs as :func:`boute.sim.fast_evaluate` computes them)."""
    if not stable:
        return Confidence(math.inf, ("unstable: offered load at or beyond capacity",))
    band, reasons = BASE_BAND, []
    if max_utilisation >= HIGH_UTILISATION:
        band += 0.25
        reasons.append(f"near saturation: tier utilisation {max_utilisation:.2f} >= {HIGH_UTILISATION}")
    if max_prefill_utilisation >= HIGH_PREFILL:
        band += 0.2
        reasons.append(
            f"prefill-bound: prompt work keeps a replica's prefill stage {max_prefill_utilisation:.2f} busy "
            f"(>= {HIGH_PREFILL})"
        )
    if arrival_cv**2 > BURSTY_CA2 and max_utilisation >= BURSTY_UTILISATION:
        band += 0.2
        reasons.append(f"bursty arrivals (cv {arrival_cv:.2f}) at utilisation {max_utilisation:.2f}")
    return Confidence(band, tuple(reasons))


def needs_confirmation(p95_s: float, confidence: Confidence, p95_cap_s: float) -> bool:
    """Whether the simulator should confirm an evaluation against a P95 cap.

    True when the fast path flags itself uncertain, or when the cap lies inside its P95 band (so the
    feasibility verdict could flip).
    """
    if confidence.uncertain:
        return True
    lo, hi = p95_s * (1.0 - confidence.band), p95_s * (1.0 + confidence.band)
    return lo <= p95_cap_s <= hi
