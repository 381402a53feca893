"""Roll out a new plan, or keep the running one? One rule, with the reason it gives.

The fast path judges both plans under the observed load, like with like; but the fast path is a model,
and a model that says "the running plan copes" while the gateway sheds or misses the SLO is the model
being wrong, not the traffic. So measured distress wins over predicted comfort:

- lost capacity always rolls out: the running plan still lists replicas that are gone, and keeping it
  would re-fire the trigger every check without ever restoring the capacity;
- a rate above the plan's headroom or a P95 over the promise rolls out (the running plan was sized for
  other traffic, and the window says so);
- so does a window in which the gateway shed or failed more than ``MAX_FAILED`` of the requests;
- otherwise (a mix shift, a rate below the plan's) the running plan stays unless, under the observed
  load, it fails the targets or the new plan is ``MIN_GAIN`` better by the plan's own objective (P95 for
  ``latency``, $/h for ``cost``, either without the other worse for ``pareto``): a rollout must buy
  something, and a rate below the plan's buys a cheaper plan only where cost is what was asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

from boute.replan.drift import Thresholds, Trigger
from boute.replan.window import Window

#: triggers that are measured distress: never answered by keeping the plan that produced them
DISTRESS = frozenset({"capacity_lost", "rate_high", "p95_over", "shedding"})
#: shed or failed requests in the window (fraction) above which the running plan is not "coping"
#: (the same share as the ``shedding`` trigger's default)
MAX_FAILED = Thresholds().max_failed
#: the P95 gain (fraction, fast path) a new plan must bring when nothing is in distress
MIN_GAIN = 0.05


@dataclass(frozen=True)
class Judged:
    """One plan under the observed load, by the fast path."""

    p95_latency_s: float
    cost_per_hour: float
    feasible: bool


@dataclass(frozen=True)
class Decision:
    roll_out: bool
    reason: str


def decide(fired: list[Trigger], w: Window, objective: str | None, before: Judged | None, after: Judged) -> Decision:
    """Whether the new plan (``after``) replaces the running one (``before``: ``None`` when it cannot be
    judged, e.g. a loaded tier left without replicas). Under distress the new plan rolls out whatever the
    fast path says of it (``boute optimize`` found it feasible with its own evaluator, and it is sized for the
    traffic now); otherwise only a new plan the fast path finds feasible replaces the running one."""
    distress = sorted({t.kind for t in fired} & DISTRESS)
    if distress:
        return Decision(True, "measured distress: " + ", ".join(distress))
    if w.failed_share > MAX_FAILED:
        return Decision(True, f"{w.failed} of {w.requests} requests shed or failed in the window")
    if not after.feasible:
        return Decision(False, "the new plan does not meet the targets under the observed load")
    if before is None or not before.feasible:
        return Decision(True, "the running plan does not meet the targets under the observed load")
    faster = after.p95_latency_s < (1 - MIN_GAIN) * before.p95_latency_s
    cheaper = after.cost_per_hour < (1 - MIN_GAIN) * before.cost_per_hour
    slower = after.p95_latency_s > (1 + MIN_GAIN) * before.p95_latency_s
    dearer = after.cost_per_hour > (1 + MIN_GAIN) * before.cost_per_hour
    kind = (objective or "latency").split(":")[0]
    gain = {"latency": faster, "cost": cheaper, "pareto": (faster and not dearer) or (cheaper and not slower)}
    if gain.get(kind, faster):
        return Decision(
            True,
            f"P95 {before.p95_latency_s:.2f} -> {after.p95_latency_s:.2f} s, "
            f"${before.cost_per_hour:.2f} -> ${after.cost_per_hour:.2f}/h under the observed load",
        )
    return Decision(False, f"the running plan copes and the new one is not {MIN_GAIN:.0%} better ({kind})")
