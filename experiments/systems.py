"""The systems of the main comparison, each run on one scenario (at its budget).

Every system returns a :class:`SystemRun`: the plan it would deploy (lowest P95 among its plans that meet the
quality floor, the P95 cap and the budget, by the evaluator it searched with) and the *pool* of plans it
evaluated, from which the throughput metric picks its best plan at a higher rate. BOute searches as
``boute optimize`` does (the simulator its objective); the baselines search on the fast path.

* ``boute``: the constrained MOBO of :mod:`boute.optimize.strategies.mobo` over routing + heterogeneous deployment.
* ``70b-homogeneous``: the large model alone, every (GPU type, TP/PP) with as many replicas as fit.
* ``70b-heterogeneous``: the large model alone on the mixed pool (random search, ``n_random`` plans).
* ``routellm-equal``: RouteLLM-style: the smallest large-tier share meeting the floor, equal budget per
  tier, each tier on one GPU type (every combination is evaluated).
* ``boute-1gpu``: BOute's joint space restricted to one GPU type, best type kept (random search per type:
  the restricted spaces have <= 5 dims, so ``n_random`` points cover them densely).
* ``cascadia``: the bi-level cascade baseline of :mod:`experiments.cascadia`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from experiments.common import Context, Evaluators
from experiments.system_run import SystemRun

SYSTEMS = ("boute", "70b-homogeneous", "70b-heterogeneous", "routellm-equal", "boute-1gpu", "cascadia")


def best_feasible(pairs: Sequence[tuple[Any, Any]]) -> tuple[Any, Any]:
    """The ``latency`` objective's pick among the feasible (candidate, result) pairs (lowest P95, its
    tie-breaks: :data:`boute.optimize.objectives.TIE_BREAKS`), or (None, None)."""
    from boute.optimize.objectives import tie_key

    feas = [(c, r) for c, r in pairs if r is not None and r.feasible]
    if not feas:
        return None, None
    return min(feas, key=lambda cr: tie_key("latency", cr[1].quality, cr[1].p95_latency_s, cr[1].cost_per_hour))


def _finish(name: str, mode: str, pairs: list[tuple[Any, Any]], t0: float, note: str = "") -> SystemRun:
    c, r = best_feasible(pairs)
    return SystemRun(name, mode, c, r, pairs, len(pairs), time.perf_counter() - t0, note)


def large_only(n_tiers: int) -> tuple[float, ...]:
    return tuple(1.0 if i == n_tiers - 1 else 0.0 for i in range(n_tiers))


def routellm_fractions(evs: Evaluators) -> tuple[float, ...]:
    """Smallest large-tier share (rest on the small tier) whose held-out preroute quality meets the floor."""
    qm = evs.quality_model
    n_t = len(evs.scenario.tiers)
    floor = evs.scenario.targets.quality_floor

    def fr(share: float) -> np.ndarray:
        f = np.zeros(n_t)
        f[-1], f[0] = share, 1.0 - share
        return f

    lo, hi = 0.0, 1.0
    if qm.preroute(fr(0.0)).quality >= floor:
        hi = 0.0
    for _ in range(30):
        if hi - lo < 1e-4:
            break
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if qm.preroute(fr(mid)).quality >= floor else (mid, hi)
    return tuple(float(v) for v in fr(hi))


def _space(scenario: Any, **kw: Any) -> Any:
    from boute.errors import InfeasibleError
    from boute.optimize.space import Space

    try:
        return Space.build(scenario, **kw)
    except InfeasibleError:
        return None


def _random_pairs(space: Any, evs: Evaluators, n: int, seed: int) -> list[tuple[Any, Any]]:
    from boute.optimize.loop import run_search
    from boute.optimize.settings import SearchSettings
    from boute.optimize.strategies.random import RandomStrategy

    settings = SearchSettings(max_evals=n, batch=1, patience=None)
    trials = run_search(space, evs.fast, RandomStrategy(space, seed=seed), settings)
    return [(t.candidate, t.result) for t in trials if t.ok]


def run_boute(
    evs: Evaluators,
    ctx: Context,
    *,
    max_evals: int,
    patience: int,
    gpus: tuple[str, ...] | None = None,
    strategy_options: dict[str, Any] | None = None,
    track: str | None = None,
    warm: Sequence[Any] = (),
) -> SystemRun:
    """BOute's search as ``boute optimize`` runs it (:meth:`Evaluators.search`: the simulator the objective,
    the fast path its prior); ``track`` names the tracking-DB experiment recording every trial, ``warm``
    holds trials of a related search (another budget, or another condition's re-scored plans) to start from."""
    from boute.optimize.session import optimize
    from boute.optimize.settings import SearchSettings

    t0 = time.perf_counter()
    sp = _space(evs.scenario, gpus=gpus)
    if sp is None:
        return SystemRun("boute", "preroute", None, None, note="no tier fits the budget")
    start = _rehome(sp, warm)
    settings = SearchSettings(
        strategy="mobo",
        max_evals=len(start) + max_evals,
        seed=ctx.seed,
        patience=patience,
        gpus=gpus,
        experiment=track,
        strategy_options=strategy_options or {},
    )
    out = optimize(evs.scenario, settings, evs.search(store=ctx.store() if track is not None else None, start=start))
    trials = out.trials
    own = trials[len(start) :]
    run = _finish(
        "boute",
        "preroute",
        [(t.candidate, t.result) for t in trials if t.ok],
        t0,
        f"mobo on the simulator, {sum(t.evaluated for t in own)} evaluations"
        f" ({sum(not t.evaluated for t in own)} proposals screened out)",
    )
    run.extra["trials"] = trials
    return run


def _rehome(space: Any, trials: Sequence[Any]) -> list[Any]:
    """Earlier trials that are valid in ``space`` (e.g. a lower budget), re-indexed: a warm start."""
    from boute.optimize.space import is_valid
    from boute.optimize.trials import Trial

    out = []
    for t in trials:
        if not t.ok or t.candidate.cost_per_hour > space.budget + 1e-9:
            continue
        try:
            z = space.encode(t.candidate)
        except (ValueError, StopIteration):
            continue
        if is_valid(space, t.candidate) is not None or space.decode(z).key() != t.candidate.key():
            continue
        zs = tuple(float(v) for v in z)
        out.append(Trial(len(out), zs, zs, t.candidate, t.result))
    return out


def run_70b_homogeneous(evs: Evaluators) -> SystemRun:
    from boute.optimize.strategies.fixed import single_tier_single_gpu

    t0 = time.perf_counter()
    n_t = len(evs.scenario.tiers)
    sp = _space(evs.scenario)
    cands = [] if sp is None else single_tier_single_gpu(sp, n_t - 1, large_only(n_t))
    run = _finish("70b-homogeneous", "preroute", [(c, evs.fast(c)) for c in cands], t0, "enumerated")
    if run.chosen is not None:
        run.extra["gpu"] = run.chosen.deployment[0].gpu
    return run


def run_70b_heterogeneous(evs: Evaluators, ctx: Context, n_random: int) -> SystemRun:
    t0 = time.perf_counter()
    n_t = len(evs.scenario.tiers)
    sp = _space(evs.scenario, tiers=(n_t - 1,), fixed_fractions=large_only(n_t))
    pairs = [] if sp is None else _random_pairs(sp, evs, n_random, ctx.seed)
    return _finish("70b-heterogeneous", "preroute", pairs, t0, f"random x{n_random}")


def run_routellm(evs: Evaluators) -> SystemRun:
    from boute.optimize.strategies.fixed import equal_split

    t0 = time.perf_counter()
    fr = routellm_fractions(evs)
    sp = _space(evs.scenario)
    cands = [] if sp is None else equal_split(sp, fr)
    run = _finish(
        "routellm-equal",
        "preroute",
        [(c, evs.fast(c)) for c in cands],
        t0,
        f"large share {fr[-1]:.3f}, {len(cands)} equal-budget placements",
    )
    run.extra["fractions"] = list(fr)
    return run


def run_one_gpu(evs: Evaluators, ctx: Context, n_random: int) -> SystemRun:
    t0 = time.perf_counter()
    pairs: list[tuple[Any, Any]] = []
    per_gpu: dict[str, float | None] = {}
    for g, n in evs.scenario.cluster.gpus.items():
        sp = _space(evs.scenario, gpus=(g,)) if n > 0 else None
        got = [] if sp is None else _random_pairs(sp, evs, n_random, ctx.seed)
        _, r = best_feasible(got)
        per_gpu[g] = None if r is None else r.p95_latency_s
        pairs += got
    run = _finish("boute-1gpu", "preroute", pairs, t0, f"random x{n_random} per GPU type")
    run.extra["per_gpu_p95_s"] = per_gpu
    if run.chosen is not None:
        run.extra["gpu"] = run.chosen.deployment[0].gpu
    return run


def runner(name: str, ctx: Context, settings: dict[str, Any]) -> Callable[[Evaluators, SystemRun | None], SystemRun]:
    """``run(evs, previous)`` for system ``name``: one step of the budget search.

    ``previous`` is the run at the last feasible (higher) budget; BOute warm-starts from its trials that
    are still valid, the other systems ignore it (they are enumerations or cheap random searches).
    """
    if name == "boute":
        return lambda evs, prev: run_boute(
            evs,
            ctx,
            max_evals=settings["bisect_evals"],
            patience=settings["bisect_patience"],
            strategy_options=settings.get("mobo_options"),
            warm=() if prev is None else prev.extra.get("trials", ()),
        )
    if name == "70b-homogeneous":
        return lambda evs, prev: run_70b_homogeneous(evs)
    if name == "70b-heterogeneous":
        return lambda evs, prev: run_70b_heterogeneous(evs, ctx, settings["n_random"])
    if name == "routellm-equal":
        return lambda evs, prev: run_routellm(evs)
    if name == "boute-1gpu":
        return lambda evs, prev: run_one_gpu(evs, ctx, settings["n_random"])
    if name == "cascadia":
        from experiments.cascadia import run_cascadia

        return lambda evs, prev: run_cascadia(evs, grid=settings["cascadia_grid"])
    raise ValueError(f"unknown system '{name}' (known: {', '.join(SYSTEMS)})")
