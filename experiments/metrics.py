"""The comparison metrics: simulator-confirmed latency, max sustainable rate, least budget meeting targets.

* ``confirm``: the discrete-event simulator on the scenario workload, requests routed by the learned router
  (the same check ``boute optimize`` does before writing a plan).
* ``max_rate``: throughput at equal budget and quality. Among a system's evaluated plans that meet the
  quality floor within the budget, the ``top_k`` with the largest fast-path capacity are bisected on the
  offered rate (largest rate whose fast-path P95 stays under the cap); the best is then confirmed by the
  simulator at that rate or, where its P95 misses the cap there, bisected on the simulator between 0 and
  that rate (``sim_steps`` halvings: the figure is within ``rate / 2**sim_steps`` of the simulator's limit).
* ``min_budget``: $/h to meet the quality floor and P95 cap at the scenario's rate: bisection on the budget,
  re-running the system (its own search) at every step; the figure reported is the cost of the cheapest
  plan meeting the targets that any step evaluated (the same rule for every system).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from experiments.common import Evaluators
from experiments.system_run import SystemRun


def evaluators_for(run: SystemRun, evs: Evaluators) -> Evaluators:
    if run.mode == evs.mode:
        return evs
    from experiments.cascadia import _cascade_evaluators

    return _cascade_evaluators(evs)


def confirm(evs: Evaluators, cand: Any, rate: float | None = None, seed: int = 0) -> dict[str, Any]:
    """Simulated figures of ``cand`` at ``rate`` (default: the scenario's)."""
    from boute.optimize.evaluators import candidate_plan, router_of
    from boute.sim import simulate
    from boute.workload import build_workload

    sc = evs.scenario
    wl = build_workload(sc, rate_rps=rate) if rate is not None else evs.sim.workload
    route = evs.quality_model.assign(wl.prompt_index, np.asarray(cand.fractions), mode=evs.mode, seed=seed)
    s = simulate(
        candidate_plan(sc, cand, evs.mode, router=router_of(evs.quality_model)), sc, wl, route, seed=seed
    ).summary()
    q = float(evs.policy(cand.fractions).quality)
    p95 = float(s["p95_latency_s"])
    return {
        "rate_rps": wl.rate_rps,
        "quality": q,
        "p95_latency_s": p95,
        "mean_latency_s": float(s["mean_latency_s"]),
        "p50_latency_s": float(s["p50_latency_s"]),
        "throughput_rps": float(s["throughput_rps"]),
        "completed": float(s.get("completed", math.nan)),
        "cost_per_hour": float(cand.cost_per_hour),
        "meets": sc.goal.met_by(q, p95, float(cand.cost_per_hour)),
    }


def fast_p95_at(evs: Evaluators, cand: Any, rate: float) -> float:
    """Fast-path P95 at another offered rate (inf when the plan is unstable there)."""
    from boute.sim import fast_evaluate

    pol = evs.policy(cand.fractions)
    tiers = [t.name for t in evs.scenario.tiers]
    res = fast_evaluate(
        list(cand.deployment),
        evs.scenario,
        replace(evs.fast.stats, rate_rps=rate),
        [float(v) for v in np.asarray(pol.visits)],
        tiers,
        mode=evs.mode,
    )
    return float(res.p95_latency_s) if res.stable else math.inf


def rate_limit(evs: Evaluators, cand: Any, hi: float, iters: int = 24) -> float:
    """Largest offered rate (req/s) in (0, hi] whose fast-path P95 is under the cap (0 if none)."""
    cap = evs.scenario.targets.p95_latency_s
    lo = 0.0
    if fast_p95_at(evs, cand, hi) <= cap:
        return hi
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fast_p95_at(evs, cand, mid) <= cap else (lo, mid)
        if hi - lo < 0.005 * max(hi, 1.0):
            break
    return lo


def max_rate(run: SystemRun, evs: Evaluators, top_k: int = 3, sim_steps: int = 8, seed: int = 0) -> dict[str, Any]:
    """Max sustainable rate of the system's best plan meeting the floor and budget (see module doc)."""
    ev = evaluators_for(run, evs)
    sc = ev.scenario
    # the fast path's figures of every plan (a simulator search's results carry no capacity)
    fast = [(c, ev.fast_of(c, r)) for c, r in run.pool if r is not None]
    pool = [
        (c, r)
        for c, r in fast
        if sc.goal.met_by(r.quality, 0.0, c.cost_per_hour)  # floor and budget; the rate is what is sought
        and r.capacity_rps is not None
        and r.capacity_rps > 0
    ]
    if not pool:
        return {"fast_rate_rps": None, "sim_rate_rps": None, "note": "no plan meets the quality floor"}
    pool.sort(key=lambda cr: -cr[1].capacity_rps)
    scored = [(rate_limit(ev, c, float(r.capacity_rps)), c) for c, r in pool[:top_k]]
    best_rate, best = max(scored, key=lambda s: s[0])
    out: dict[str, Any] = {
        "fast_rate_rps": best_rate,
        "plan_cost_per_hour": best.cost_per_hour,
        "fractions": list(best.fractions),
        "deployment": best.deployment,
    }
    cap = sc.targets.p95_latency_s
    sim = confirm(ev, best, best_rate, seed) if best_rate > 0 else None
    if sim is not None and sim["p95_latency_s"] > cap:
        # the simulator disagrees at the fast path's rate: bisect on it, between 0 and that rate
        out["sim_at_fast_rate"] = sim
        lo, hi, sim = 0.0, best_rate, None
        for _ in range(sim_steps):
            mid = (lo + hi) / 2
            got = confirm(ev, best, mid, seed)
            lo, hi, sim = (mid, hi, got) if got["p95_latency_s"] <= cap else (lo, mid, sim)
        best_rate = lo
    ok = sim is not None and sim["p95_latency_s"] <= cap
    out["sim_rate_rps"] = best_rate if ok else None
    out["sim"] = sim
    return out


def cheapest_feasible(run: SystemRun) -> Any:
    """The cheapest plan of a run's pool that meets all targets (its budget included)."""
    feas = [c for c, r in run.pool if r is not None and r.feasible]
    return min(feas, key=lambda c: c.cost_per_hour) if feas else None


def min_budget(
    run_at: Callable[[Evaluators, SystemRun | None], SystemRun],
    evs: Evaluators,
    *,
    lo: float = 1.0,
    ceiling: float = 120.0,
    tol: float = 1.0,
    start: SystemRun | None = None,
) -> dict[str, Any]:
    """Least budget at which ``run_at`` finds a plan meeting the targets (bisection; see module doc).

    Every step counts the cheapest plan meeting the targets that the system evaluated (not only the one
    it would deploy, which minimises P95), so the bisection starts from that plan's cost. ``start``: the
    system's run at the nominal budget, when there is one: not repeated, and the first warm start.
    """
    nominal = evs.scenario.cluster.budget_per_hour
    steps: list[tuple[float, bool]] = []
    prev: SystemRun | None = None  # last feasible run: BOute's warm start
    cheapest: Any = None

    def take(r: SystemRun) -> bool:
        nonlocal prev, cheapest
        c = cheapest_feasible(r)
        if c is None:
            return False
        prev = r
        if cheapest is None or c.cost_per_hour < cheapest.cost_per_hour:
            cheapest = c
        return True

    def feasible(b: float) -> bool:
        ok = take(run_at(evs.at_budget(b), prev))
        steps.append((b, ok))
        return ok

    hi = nominal
    if start is not None and take(start):
        steps.append((nominal, True))
    while cheapest is None and not feasible(hi):
        lo = hi
        hi *= 1.5
        if hi > ceiling:
            return {
                "budget_per_hour": None,
                "cost_per_hour": None,
                "steps": steps,
                "note": f"no plan meets the targets up to ${ceiling:g}/h",
            }
    hi = min(hi, cheapest.cost_per_hour)
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = min(mid, cheapest.cost_per_hour)
        else:
            lo = mid
    return {
        "budget_per_hour": max(hi, cheapest.cost_per_hour),
        "cost_per_hour": cheapest.cost_per_hour,
        "plan": cheapest,
        "mode": prev.mode if prev is not None else evs.mode,
        "steps": steps,
    }
