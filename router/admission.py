"""What a plan admits per tier: the requests in flight before shedding, and the longest context served.

Both are read off the plan alone (its scenario's rate and P95 cap, its deployment and catalog), so every
gateway replica serving the plan bounds its tiers alike.
"""

from __future__ import annotations

import math
from pathlib import Path

from boute.quality.shares import cascade_visits
from boute.specs.plan import Plan

#: requests in flight per replica before shedding, for a plan that does not carry its scenario
DEFAULT_INFLIGHT_PER_REPLICA = 256
#: the gateway-wide bound never goes below this
MIN_GATEWAY_INFLIGHT = 1024


def planned_inflight(plan: Plan) -> dict[str, int]:
    """Per tier, the requests in flight per replica at which shedding starts: the tier's planned rate times
    the plan's P95 cap, over its replicas (Little's law: what the tier holds if every request took the
    whole cap).

    Below that, the gateway would refuse traffic the plan was made to serve (a fixed 256 per replica shed
    130 requests of a rate step whose P95 stayed under the promise: one H100 replica carried ~120 req/s at
    ~2 s). Above it, the queue is deeper than the tier drains within the cap at its planned rate, so an
    overload sheds before admitted requests miss the target. Never below ``DEFAULT_INFLIGHT_PER_REPLICA``
    (the bound before plans set it; a lightly loaded tier keeps room for bursts and mix shifts), which is
    also what a plan without its scenario gets.
    """
    spec = plan.scenario_spec or {}
    try:
        rate = float(spec["workload"]["rate_rps"])
        cap = float(spec["targets"]["p95_latency_s"])
    except (KeyError, TypeError, ValueError):
        rate = cap = 0.0
    r = plan.routing
    fr = [float(f) for f in (r.fractions or [])]
    if r.mode == "cascade" and fr:  # tier k sees every query not accepted before it
        fr = [float(v) for v in cascade_visits(fr)]
    out: dict[str, int] = {}
    for k, tier in enumerate(r.tiers):
        replicas = sum(g.count for g in plan.groups(tier))
        share = fr[k] if k < len(fr) else 0.0
        planned = math.ceil(rate * share * cap / replicas) if replicas and rate > 0 and cap > 0 else 0
        out[tier] = max(planned, DEFAULT_INFLIGHT_PER_REPLICA)
    return out


def tier_context(plan: Plan, file: str | Path | None = None) -> dict[str, int]:
    """Per tier, the least ``max_context`` of the models its groups deploy (the plan's own catalog: packaged
    entries plus its scenario's); a tier whose model the catalog lacks has no entry (no limit checked)."""
    from boute.serving.bundle import plan_catalog

    catalog = plan_catalog(plan, file)
    out: dict[str, int] = {}
    for g in plan.deployment:
        spec = catalog.models.get(g.model)
        if spec is not None:
            out[g.tier] = min(out.get(g.tier, spec.max_context), spec.max_context)
    return out
