"""Experiment 5's cost searches, protocol (b): each system's cheapest plan with a fixed number of evaluations
(BOute's cost objective as ``boute optimize`` runs it, the simulator its objective and the fast path its
prior; the baselines' own families and searches on the fast path), then the cheapest of them the simulator
confirms. :mod:`experiments.cost` runs them per scenario and target."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from experiments.common import Context, Evaluators, deployment_text


# ---- scenarios at another rate / budget ---------------------------------------------------------------
def inventory_cost(sc: Any) -> float:
    """$/h of every GPU in the inventory: the ceiling of the cost searches (budget is not a target here)."""
    return float(sum(n * sc.price(g) for g, n in sc.cluster.gpus.items()))


def at(sc: Any, rate: float | None = None, budget: float | None = None) -> Any:
    from boute.optimize.plan_run import with_targets

    out = with_targets(sc, budget, None, None)
    if rate is not None:
        out = out.model_copy(update={"workload": out.workload.model_copy(update={"rate_rps": float(rate)})})
    return out


class Family:
    """Evaluators of one scenario for several rates and modes, sharing one quality model per mode."""

    def __init__(self, sc: Any, seed: int = 0) -> None:
        self.sc = sc
        self.seed = seed
        self._qm: dict[str, Any] = {}
        self._evs: dict[tuple[str, float | None, float | None], Evaluators] = {}

    def evs(self, mode: str = "preroute", rate: float | None = None, budget: float | None = None) -> Evaluators:
        key = (mode, None if rate is None else round(rate, 6), budget)
        if key not in self._evs:
            from boute.optimize.evaluators import FastEvaluator

            sc = at(self.sc, rate, budget)
            fast = FastEvaluator(sc, mode, quality_model=self._qm.get(mode))
            self._qm.setdefault(mode, fast.quality_model)
            self._evs[key] = Evaluators(sc, mode, self.seed, _fast=fast)
        return self._evs[key]


# ---- (b): each system's cheapest plan with `evals` fast evaluations ----------------------------------------
def _space(sc: Any, **kw: Any) -> Any:
    from experiments.systems import _space as space

    return space(sc, **kw)


def _boute(
    evs: Evaluators, ctx: Context, n: int, track: str | None, gpus: tuple[str, ...] | None = None, fast: bool = False
) -> Any:
    """``boute optimize --objective cost`` with ``n`` evaluations (:meth:`Evaluators.search`): the Outcome.
    ``fast``: search on the fast path instead (the one-GPU-type baseline, which searches as baselines do)."""
    from boute.optimize.session import SearchRuntime, optimize
    from boute.optimize.settings import SearchSettings

    store = ctx.store() if track else None
    settings = SearchSettings(
        objective="cost", max_evals=n, seed=ctx.seed, mode=evs.mode, patience=None, gpus=gpus, experiment=track
    )
    if fast:  # one proposal a step, evaluated in this process
        settings = replace(settings, batch=1, workers=1)
        return optimize(evs.scenario, settings, SearchRuntime(evaluator=evs.fast, store=store))
    return optimize(evs.scenario, settings, evs.search(store=store))


def _pairs(out: Any) -> list:
    return [(t.candidate, t.result) for t in out.trials if t.ok]


def _smallest_feasible(evs: Evaluators, ladders: list[list[Any]], n: int) -> list:
    """Per ladder (one family member at growing sizes, P95 falling with size), bisect for the smallest size
    meeting the targets; ladders are taken cheapest first and ``n`` fast evaluations are spent at most."""
    done: dict[str, Any] = {}

    def ev(c: Any) -> Any:
        if c.key() not in done:
            done[c.key()] = (c, evs.fast(c))
        return done[c.key()][1]

    for ladder in sorted((lad for lad in ladders if lad), key=lambda lad: lad[0].cost_per_hour):
        lo, hi = 0, len(ladder) - 1
        if len(done) >= n:
            break
        if not ev(ladder[hi]).feasible:  # even the largest fails: the ladder is out
            continue
        while lo < hi and len(done) < n:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ev(ladder[mid]).feasible else (mid + 1, hi)
    return list(done.values())


def _homogeneous_family(evs: Evaluators) -> list[list[Any]]:
    """70B alone on one GPU type: per (GPU type, config), the ladder of replica counts the inventory allows."""
    from experiments.systems import large_only

    sc = evs.scenario
    sp = _space(sc)
    if sp is None:
        return []
    n_t = len(sc.tiers)
    fixed = _space(sc, gpus=sp.gpus, tiers=sp.active_tiers, fixed_fractions=large_only(n_t))
    out = []
    for p in sp.pairs:
        if p.tier != n_t - 1:
            continue
        for k, c in enumerate(p.configs):
            ladder = []
            for n in range(1, p.inventory // c.gpus + 1):
                x = np.zeros(sp.dim)
                x[p.count_dim] = n * c.gpus / p.inventory
                if p.config_dim is not None:
                    x[p.config_dim] = (k + 0.5) / len(p.configs)
                cand = fixed.decode(x[sp.n_routing :])
                if len(cand.deployment) == 1 and cand.deployment[0].count == n:
                    ladder.append(cand)
            out.append(ladder)
    return out


def _equal_family(evs: Evaluators) -> list[list[Any]]:
    """RouteLLM-style: the floor's routing and each tier the same budget on one GPU type; per choice of
    (GPU type, config) for every tier, the ladder of its plans as the budget grows."""
    from boute.optimize.strategies.fixed import equal_split
    from experiments.systems import routellm_fractions

    fr = routellm_fractions(evs)
    ladders: dict[tuple, dict[str, Any]] = {}
    for b in np.arange(1.0, evs.scenario.cluster.budget_per_hour + 1e-9, 0.5):
        sp = _space(at(evs.scenario, budget=float(b)))
        for c in equal_split(sp, fr) if sp is not None else []:
            kind = tuple(sorted((g.tier, g.gpu, g.tp, g.pp) for g in c.deployment))
            ladders.setdefault(kind, {})[c.key()] = c
    return [sorted(d.values(), key=lambda c: c.cost_per_hour) for d in ladders.values()]


def _cascadia_cost(evs: Evaluators, n: int, grid: int) -> list:
    """Cascadia's bi-level search in cost mode: per accept-share grid point (its quality checked exactly,
    free), the least-price MILP over latency-table levels within the cap, tightened until the fast path
    agrees; every fast-path evaluation counts towards ``n``."""
    from boute.optimize.space import Candidate
    from experiments.cascadia import _cascade_evaluators, accept_grid, latency_table, solve_min_cost

    ce = evs if evs.mode == "cascade" else _cascade_evaluators(evs)
    sc = ce.scenario
    table = latency_table(ce)
    floor, cap, rate = sc.targets.quality_floor, sc.targets.p95_latency_s, sc.workload.rate_rps
    pairs: list = []
    shares = [fr for fr in accept_grid(len(sc.tiers), grid) if ce.policy(fr).quality >= floor - 1e-12]
    for fr in sorted(shares, key=lambda f: -f[0]):  # most accepted at the small tier first: cheapest
        pol = ce.policy(fr)
        for alpha in (1.0, 0.7, 0.5, 0.35):
            if len(pairs) >= n:
                return pairs
            dep = solve_min_cost(ce, table, np.asarray(pol.visits, dtype=float) * rate, alpha * cap)
            if dep is None:
                break
            cost = float(sum(g.gpus_used * sc.price(g.gpu) for g in dep))
            cand = Candidate(tuple(fr), dep, cost)
            res = ce.fast(cand)
            pairs.append((cand, res))
            if res.feasible:
                break
    return pairs


def cost_search(
    system: str, fam: Family, rate: float | None, ctx: Context, st: dict[str, Any], track: str | None
) -> tuple[str, list, Any]:
    """``(mode, [(candidate, result)], BOute's Outcome or None)``: ``system``'s own search for its cheapest
    plan, ``evals`` evaluations long (the simulator's for BOute's searches, else the fast path's)."""
    from experiments.systems import _random_pairs, large_only

    n = st["evals"]
    ceiling = inventory_cost(fam.sc)
    if system in ("cascadia", "boute-cascade"):
        evs = fam.evs("cascade", rate, ceiling)
        if system == "cascadia":
            return "cascade", _cascadia_cost(evs, n, max(st["cascadia_grid"], n)), None
        out = _boute(evs, ctx, n, track)
        return "cascade", _pairs(out), out
    evs = fam.evs("preroute", rate, ceiling)
    if system == "boute":
        out = _boute(evs, ctx, n, track)
        return "preroute", _pairs(out), out
    if system == "70b-homogeneous":
        return "preroute", _smallest_feasible(evs, _homogeneous_family(evs), n), None
    if system == "70b-heterogeneous":
        n_t = len(evs.scenario.tiers)
        sp = _space(evs.scenario, tiers=(n_t - 1,), fixed_fractions=large_only(n_t))
        return "preroute", [] if sp is None else _random_pairs(sp, evs, n, ctx.seed), None
    if system == "routellm-equal":
        return "preroute", _smallest_feasible(evs, _equal_family(evs), n), None
    if system == "boute-1gpu":
        types = [g for g, k in evs.scenario.cluster.gpus.items() if k > 0]
        pairs: list = []
        for i, g in enumerate(types):
            share = n // len(types) + (1 if i < n % len(types) else 0)
            if _space(evs.scenario, gpus=(g,)) is not None and share > 0:
                pairs += _pairs(_boute(evs, ctx, share, None, gpus=(g,), fast=True))
        return "preroute", pairs, None
    raise ValueError(f"unknown system '{system}'")


def _figures(cand: Any, fast: Any, sim: Any) -> dict[str, Any]:
    return {
        "cost_per_hour": cand.cost_per_hour,
        "quality": sim.quality,
        "fast_p95_s": None if fast is None else fast.p95_latency_s,
        "sim_p95_s": sim.p95_latency_s,
        "fractions": list(cand.fractions),
        "plan": deployment_text(cand.deployment),
    }


def cheapest_confirmed(pairs: list, evs: Evaluators, k: int) -> dict[str, Any]:
    """A baseline's figure: the cheapest of its plans meeting the targets by the fast path that the simulator
    confirms, trying at most ``k`` in the staircase order of :func:`boute.optimize.confirm.candidates`."""
    from boute.optimize.confirm import candidates, distinct
    from boute.optimize.objectives import Objective
    from boute.optimize.trials import Trial

    trials = [Trial(i, (), (), c, r) for i, (c, r) in enumerate(pairs) if r is not None]
    order = distinct(candidates(trials, Objective("cost"), evs.scenario.goal), k)
    out: dict[str, Any] = {"evals": len(pairs), "fast_feasible": sum(bool(r and r.feasible) for _, r in pairs)}
    if not order:
        out["note"] = "no plan meets the targets by the fast path"
        return out
    out["cheapest_fast_per_hour"] = order[0].result.cost_per_hour  # type: ignore[union-attr]
    tried = []
    for t in order:
        sim = evs.sim(t.candidate)
        tried.append(
            {"cost_per_hour": t.candidate.cost_per_hour, "sim_p95_s": sim.p95_latency_s, "meets": sim.feasible}
        )
        if sim.feasible:
            out.update(_figures(t.candidate, t.result, sim))
            break
    out["confirmations"] = tried
    if "cost_per_hour" not in out:
        out["note"] = f"the simulator rejected all {len(tried)} plans it checked"
    return out


def boute_confirmed(outcome: Any, evs: Evaluators) -> dict[str, Any]:
    """BOute's figure: what ``boute optimize`` writes. Its search's evaluator is the simulator, so (as in
    :func:`boute.optimize.plan_run.make_plan`) the chosen plan is its own confirmation: no further simulator
    runs (the baselines' ``confirm`` budget is not spent)."""
    pairs = _pairs(outcome)
    fast_ok = [c.cost_per_hour for c, r in pairs if evs.fast_of(c, r).feasible]
    out: dict[str, Any] = {"evals": outcome.evaluations, "fast_feasible": len(fast_ok)}
    t = outcome.chosen
    if t is None:
        out["note"] = "no plan meets the targets by the simulator"
        return out
    out["cheapest_fast_per_hour"] = min(fast_ok, default=None)
    r = t.result
    out["confirmations"] = [
        {"cost_per_hour": t.candidate.cost_per_hour, "sim_p95_s": r.p95_latency_s, "meets": r.feasible}
    ]
    out.update(_figures(t.candidate, evs.fast_of(t.candidate, r), r))
    return out


def confirmed_cost(
    found: tuple[str, list, Any], fam: Family, rate: float | None, st: dict[str, Any], ctx: Context
) -> dict[str, Any]:
    """One system's simulator-confirmed least cost from its search ``found`` (``cost_search``'s result)."""
    mode, pairs, outcome = found
    evs = fam.evs(mode, rate, inventory_cost(fam.sc))
    if outcome is not None:
        return {"mode": mode, **boute_confirmed(outcome, evs)}
    return {"mode": mode, **cheapest_confirmed(pairs, evs, st["confirm"])}
