"""A Cascadia-style bi-level baseline (cascade routing): thresholds outside, deployment by MILP inside.

Cascadia (the same group, before BOute) serves a *cascade*: every query starts at the smallest model and
a judge decides to accept the answer or pass the query up. It optimises in two levels:

* inner: given the load each tier sees (``visits * rate``), pick GPU type, TP/PP and replica count per
  tier by a mixed-integer programme over a latency lookup table;
* outer: tune the thresholds (here: the accept share per tier, which maps to a verifier threshold by
  calibrated quantiles) to minimise latency plus a penalty for missing the quality floor.

Our rendition. The lookup table comes from the same analytical fast path BOute uses: for every (tier,
GPU type, fitting TP/PP) one replica is evaluated at utilisation levels ``LEVELS`` of its capacity,
giving a (per-replica rate, P95) pair per level. MILP variables ``n[t, g, c, l]`` = replicas of that kind
run at level ``l``; constraints: GPU inventory per type, the price budget, served rate >= each tier's
load; objective: load-weighted P95 of the table entries (plus a tiny cost term to break ties). Solved
with HiGHS through ``scipy.optimize.milp``. Outer: a grid over the accept shares; for penalty weights
1, 10, 100, ... the grid point minimising ``P95 / cap + w * shortfall / floor`` is taken, stopping at the
first weight whose choice meets the floor. Each resulting plan is scored by the fast path in cascade
mode (judge delay per hop included) and counts only if it meets all targets, as for every system.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from experiments.common import Evaluators
from experiments.system_run import SystemRun

LEVELS = (0.3, 0.5, 0.7, 0.85)  # utilisation of one replica's capacity at which the table is measured
PENALTIES = (1.0, 10.0, 100.0, 1e3, 1e4)


@dataclass(frozen=True)
class Entry:
    tier: int
    gpu: str
    tp: int
    pp: int
    level: float
    rate_rps: float  # requests/s one replica serves at this level
    p95_s: float
    gpus: int
    price: float  # USD/h of one replica


_TABLES: dict[tuple[Any, ...], list[Entry]] = {}


def latency_table(evs: Evaluators) -> list[Entry]:
    """Per-replica (rate, P95) at each utilisation level, for every deployable (tier, GPU, config)."""
    from boute.optimize.space import Config, fitting_configs
    from boute.sim import fast_evaluate
    from boute.specs import ReplicaGroup

    sc = evs.scenario
    stats = evs.fast.stats
    key = (sc.name, tuple(sorted(sc.cluster.gpus.items())), tuple(sorted(sc.cluster.prices.items())), stats)
    if key in _TABLES:
        return _TABLES[key]
    tiers = [t.name for t in sc.tiers]
    out: list[Entry] = []
    for ti, t in enumerate(sc.tiers):
        visits = [1.0 if i == ti else 0.0 for i in range(len(tiers))]
        for g, inv in sc.cluster.gpus.items():
            if inv <= 0:
                continue
            for c in fitting_configs(sc, ti, g):
                grp = [ReplicaGroup(tier=t.name, model=t.model, gpu=g, count=1, tp=c.tp, pp=c.pp, dtype=t.dtype)]
                cap = fast_evaluate(grp, sc, stats, visits, tiers, mode="preroute").capacity_rps
                if not (cap > 0 and math.isfinite(cap)):
                    continue
                for lv in LEVELS:
                    res = fast_evaluate(grp, sc, replace(stats, rate_rps=lv * cap), visits, tiers, mode="preroute")
                    if res.stable and math.isfinite(res.p95_latency_s):
                        price = Config(c.tp, c.pp).gpus * sc.price(g)
                        out.append(Entry(ti, g, c.tp, c.pp, lv, lv * cap, float(res.p95_latency_s), c.gpus, price))
    _TABLES[key] = out
    return out


def solve_deployment(evs: Evaluators, table: list[Entry], loads: np.ndarray) -> tuple[Any, ...] | None:
    """The MILP: replica groups serving ``loads`` (req/s per tier) within inventory and budget, or None."""
    items = [e for e in table if loads[e.tier] > 1e-9]
    if not items:
        return None
    total = float(loads.sum())
    return _solve(evs.scenario, items, loads, np.array([e.rate_rps * e.p95_s / total + 1e-4 * e.price for e in items]))


def solve_min_cost(evs: Evaluators, table: list[Entry], loads: np.ndarray, p95_limit: float) -> tuple[Any, ...] | None:
    """Cascadia's MILP in cost mode: the cheapest replicas serving ``loads`` with every replica run at a
    table level whose P95 is within ``p95_limit`` (inventory and budget as in :func:`solve_deployment`)."""
    items = [e for e in table if loads[e.tier] > 1e-9 and e.p95_s <= p95_limit]
    if not items:
        return None
    return _solve(evs.scenario, items, loads, np.array([e.price + 1e-6 * e.p95_s for e in items]))


def _solve(sc: Any, items: list[Entry], loads: np.ndarray, cost: np.ndarray) -> tuple[Any, ...] | None:
    """Integer replica counts per table entry minimising ``cost`` (one coefficient per entry) subject to the
    GPU inventory, the budget and every loaded tier's rate: the constraints both MILP modes share."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    from boute.specs import ReplicaGroup

    rows, lo, hi = [], [], []
    for g, inv in sc.cluster.gpus.items():
        rows.append([e.gpus if e.gpu == g else 0 for e in items])
        lo.append(-np.inf)
        hi.append(inv)
    rows.append([e.price for e in items])
    lo.append(-np.inf)
    hi.append(sc.cluster.budget_per_hour + 1e-9)
    for ti, load in enumerate(loads):
        if load > 1e-9:
            rows.append([e.rate_rps if e.tier == ti else 0.0 for e in items])
            lo.append(float(load))
            hi.append(np.inf)
    ub = np.array([sc.cluster.gpus[e.gpu] // e.gpus for e in items], dtype=float)
    res = milp(
        cost,
        constraints=LinearConstraint(np.array(rows, dtype=float), lo, hi),
        integrality=np.ones(len(items)),
        bounds=Bounds(np.zeros(len(items)), ub),
        options={"time_limit": 10.0},
    )
    if res.x is None or not res.success:
        return None
    counts: dict[tuple[int, str, int, int], int] = {}
    for e, n in zip(items, np.rint(res.x).astype(int), strict=True):
        if n > 0:
            k = (e.tier, e.gpu, e.tp, e.pp)
            counts[k] = counts.get(k, 0) + int(n)
    tiers = sc.tiers
    return tuple(
        ReplicaGroup(tier=tiers[t].name, model=tiers[t].model, gpu=g, count=n, tp=tp, pp=pp, dtype=tiers[t].dtype)
        for (t, g, tp, pp), n in sorted(counts.items())
    )


def accept_grid(n_tiers: int, points: int) -> list[tuple[float, ...]]:
    """Accept shares per tier (on the simplex) on a stick-breaking grid of ``points`` values per dim."""
    us = np.linspace(0.0, 1.0, points)
    out = []
    for combo in itertools.product(us, repeat=n_tiers - 1):
        fr, rest = [], 1.0
        for u in combo:
            fr.append(u * rest)
            rest -= u * rest
        fr.append(max(rest, 0.0))
        out.append(tuple(float(v) for v in fr))
    return out


def run_cascadia(evs: Evaluators, grid: int = 21) -> SystemRun:
    """The bi-level baseline on ``evs.scenario`` (its budget); evaluations in cascade mode."""
    from boute.optimize.space import Candidate

    t0 = time.perf_counter()
    ce = evs if evs.mode == "cascade" else _cascade_evaluators(evs)
    sc = ce.scenario
    table = latency_table(ce)
    rate = sc.workload.rate_rps
    floor, cap = sc.targets.quality_floor, sc.targets.p95_latency_s
    scored: list[tuple[Any, Any, float]] = []  # (candidate, result, shortfall)
    for fr in accept_grid(len(sc.tiers), grid):
        pol = ce.policy(fr)
        dep = solve_deployment(ce, table, np.asarray(pol.visits, dtype=float) * rate)
        if dep is None:
            continue
        cost = float(sum(g.gpus_used * sc.price(g.gpu) for g in dep))
        cand = Candidate(fr, dep, cost)
        res = ce.fast(cand)
        scored.append((cand, res, max(0.0, floor - res.quality)))
    pick: tuple[Any, Any, float] | None = None
    weight = None
    for w in PENALTIES:
        if not scored:
            break
        pick = min(scored, key=lambda s: min(s[1].p95_latency_s, 1e6) / cap + w * s[2] / max(floor, 1e-9))
        weight = w
        if pick[2] <= 1e-12:
            break
    chosen, result = (pick[0], pick[1]) if pick is not None and pick[1].feasible else (None, None)
    run = SystemRun(
        "cascadia",
        "cascade",
        chosen,
        result,
        [(c, r) for c, r, _ in scored],
        len(scored),
        time.perf_counter() - t0,
        f"MILP (HiGHS) x{len(scored)} thresholds, penalty {weight:g}" if weight else "",
    )
    run.extra.update({"table_entries": len(table), "penalty": weight})
    return run


_CASCADE: dict[tuple[Any, ...], Evaluators] = {}


def _cascade_evaluators(evs: Evaluators) -> Evaluators:
    """Cascade-mode evaluators for the same scenario (shared across budgets: only feasibility changes)."""
    base_key = (evs.scenario.name, evs.scenario.targets, evs.fast.stats)
    if base_key not in _CASCADE:
        _CASCADE[base_key] = Evaluators(evs.scenario, "cascade", evs.seed)
    base = _CASCADE[base_key]
    if base.scenario.cluster.budget_per_hour == evs.scenario.cluster.budget_per_hour:
        return base
    return base.at_budget(evs.scenario.cluster.budget_per_hour)
