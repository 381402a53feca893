"""One search end to end: space, screens, evaluator, strategy, tracking, resume, choice: an Outcome.

:func:`optimize` takes the search's :class:`~boute.optimize.settings.SearchSettings` whole and what runs it
(:class:`SearchRuntime`), and goes through named steps: :func:`_set_up` builds the space, the evaluator,
the strategy and the screens; :func:`boute.optimize.experiment.open_experiment` resumes the experiment's
trials from the tracking store (or records a warm start); the loop (:func:`boute.optimize.loop.run_search`)
searches; :func:`_outcome` chooses (:mod:`boute.optimize.trials`) and :func:`_finish` records the front and
the experiment's status. Confirmation (:func:`boute.optimize.confirm.confirm`) completes the outcome,
:func:`boute.optimize.final_plan.build_plan` turns it into the plan to write. It owns no I/O beyond the
tracking store and the ``on_trial`` callback (the CLI's progress bar), so the plan file is written by the
caller (:func:`boute.optimize.plan_run.make_plan`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from boute.errors import InfeasibleError
from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import Evaluator
from boute.optimize.evaluators.factory import make_evaluator
from boute.optimize.evaluators.pool import EvaluatorPool
from boute.optimize.evaluators.ray_pool import RayEvaluatorPool
from boute.optimize.experiment import Opened, open_experiment
from boute.optimize.loop import LoopHooks, run_search
from boute.optimize.objectives import Objective
from boute.optimize.outcome import Outcome
from boute.optimize.records import front_point
from boute.optimize.screen import Screen
from boute.optimize.settings import SearchSettings
from boute.optimize.space import Space
from boute.optimize.status import ExperimentStatus
from boute.optimize.strategies.base import Strategy
from boute.optimize.strategies.factory import make_strategy
from boute.optimize.trial_store import TrialStore
from boute.optimize.trials import Trial, choose, figures, hypervolume, hypervolume3, pareto_front
from boute.specs import Scenario


@dataclass(frozen=True)
class SearchRuntime:
    """What a search runs with beside its settings: objects, not settings.

    ``evaluator``: the search's evaluator (None: built from ``settings.evaluator``). ``prior``: a cheaper
    evaluator (the fast path) whose P95 MOBO's GP corrects: the search evaluator (the simulator) is the
    objective and the GP models only its discrepancy from the prior, plan by plan. ``store``: the tracking
    store (None: nothing recorded, nothing resumed). ``on_trial``: each finished trial, with the trials the
    search started from (the CLI's progress bar). ``clock``: where the search's time goes
    (:mod:`boute.optimize.clock`), read live by a progress bar; the phases are kept on the outcome and
    recorded with the experiment (``phase_s``). ``start``: trials of a related search valid in this space
    (the same scenario at another budget, say) that this one starts from when no stored trials resume it;
    they count towards ``max_evals`` like resumed ones.
    """

    evaluator: Evaluator | None = None
    prior: Evaluator | None = None
    store: TrialStore | None = None
    on_trial: Callable[[Trial, list[Trial]], None] | None = None
    clock: SearchClock = field(default_factory=SearchClock)
    start: Sequence[Trial] = ()


def check_targets_reachable(scenario: Scenario, evaluator: Evaluator) -> None:
    """Fail fast when the floor is above what the best tier alone reaches: no plan can meet it."""
    if evaluator.quality_model is None:  # a sampled quality: nothing exact to check against
        return
    tier_q = [float(q) for q in evaluator.quality_model.tier_quality]
    best = max(tier_q)
    if scenario.targets.quality_floor > best + 1e-9:
        names = [t.name for t in scenario.tiers]
        raise InfeasibleError(
            f"targets.quality_floor: {scenario.targets.quality_floor:g} is above the best tier's quality "
            f"{best:.4f} ({names[int(max(range(len(names)), key=lambda i: tier_q[i]))]}); no routing can reach it"
        )


@dataclass(frozen=True)
class _Parts:
    """What one search is built from (:func:`_set_up`)."""

    space: Space
    evaluator: Evaluator
    strategy_name: str  # as recorded: ``mobo`` becomes ``mobo-gp`` without an exact quality model
    strategy: Strategy
    screen: Screen | None
    objective: Objective


def optimize(scenario: Scenario, settings: SearchSettings, runtime: SearchRuntime | None = None) -> Outcome:
    """Search, record, choose (module doc): ``settings`` says what and how (``objective``/``prefer``:
    :mod:`boute.optimize.objectives`; ``screen``: project proposals onto the quality floor and drop plans
    over the capacity bound, :mod:`boute.optimize.screen`; ``batch``/``workers``: proposals per step and the
    processes evaluating them, :mod:`boute.optimize.evaluators.pool`, None: one per core; ``ray_address``:
    evaluate on that Ray cluster's actors instead, :mod:`boute.optimize.evaluators.ray_pool`;
    ``time_budget_s``: end the search within this many seconds, set-up included, :mod:`boute.optimize.pace`);
    ``runtime`` runs it."""
    rt = runtime if runtime is not None else SearchRuntime()
    clock = rt.clock
    t_setup = time.perf_counter()
    deadline = None if settings.time_budget_s is None else time.monotonic() + float(settings.time_budget_s)
    parts = _set_up(scenario, settings, rt)
    opened = open_experiment(
        rt.store, scenario, settings, parts.strategy_name, parts.evaluator.name, rt.start, clock=clock
    )
    on_trial = rt.on_trial
    started = opened.trials

    def record(t: Trial) -> None:
        opened.tracked.add_trial(t)
        if on_trial is not None:
            on_trial(t, started)

    # never converged inside the initial design, nor before a warm start's first evaluation of its own
    min_trials = max(parts.strategy.n_init, opened.warm) + 1
    with _pool(parts.evaluator, scenario, settings) as pool:
        if _idle_while_proposing(pool, settings):
            parts.strategy.use_prior_many(pool.prior_p95_soon)
        clock.add("setup", time.perf_counter() - t_setup)
        done = run_search(
            parts.space,
            parts.evaluator,
            parts.strategy,
            settings,
            trials=opened.trials,
            min_trials=min_trials,
            screen=parts.screen,
            hooks=LoopHooks(on_trial=record, pool=pool, deadline=deadline, clock=clock),
        )
    out = _outcome(parts, done, opened, clock)
    _finish(out, opened, parts.evaluator.name)
    return out


def _set_up(scenario: Scenario, settings: SearchSettings, rt: SearchRuntime) -> _Parts:
    """The space, the evaluator (checked against the floor), the strategy (with the prior) and the screens."""
    obj = settings.chosen_by
    space = Space.build(scenario, gpus=settings.gpus)
    ev = (
        rt.evaluator
        if rt.evaluator is not None
        else make_evaluator(settings.evaluator, scenario, settings.mode, settings.seed)
    )
    check_targets_reachable(scenario, ev)
    strategy = settings.strategy
    if strategy == "mobo" and ev.quality_model is None:
        strategy = "mobo-gp"  # no exact quality to model: learn it too (recorded under its own name)
    options: dict[str, Any] = {"objective": obj, **settings.strategy_options}
    prior = rt.prior
    if prior is not None and strategy == "mobo" and prior.fidelity < ev.fidelity:
        fast = prior
        options["prior"] = lambda cand: fast(cand).p95_latency_s
    strat = make_strategy(strategy, space, settings.seed, **options)
    scr = Screen.build(space, ev.quality_model, ev.mode, ev.workload) if settings.screen else None
    return _Parts(space, ev, strategy, strat, scr, obj)


def _pool(evaluator: Evaluator, scenario: Scenario, settings: SearchSettings) -> EvaluatorPool:
    """The processes evaluating a batch: local workers, or a Ray cluster's actors (``ray_address``)."""
    if settings.ray_address is None:
        return EvaluatorPool(evaluator, scenario, settings.seed, workers=settings.workers)
    return RayEvaluatorPool(evaluator, scenario, settings.seed, address=settings.ray_address, workers=settings.workers)


def _idle_while_proposing(pool: EvaluatorPool | RayEvaluatorPool, settings: SearchSettings) -> bool:
    """Whether ``pool``'s local workers wait while the strategy proposes (no overlap) and can compute its prior
    (:meth:`EvaluatorPool.prior_p95`): then a pool's thousands of prior figures use every core, not one."""
    return isinstance(pool, EvaluatorPool) and pool.computes_prior and not (settings.pipeline and settings.overlap)


def _outcome(parts: _Parts, done: list[Trial], opened: Opened, clock: SearchClock) -> Outcome:
    """The choice among the trials (:mod:`boute.optimize.trials`): chosen, closest, front, hypervolume."""
    obj = parts.objective
    tg = parts.space.scenario.goal
    chosen, closest = choose(done, tg, obj)
    front = pareto_front(done, obj, tg)
    _, q, p, c = figures(done)
    hv = hypervolume(q, p, tg) if obj.name == "latency" else hypervolume3(q, p, c, tg)
    return Outcome(
        parts.space,
        done,
        chosen,
        closest,
        front,
        hv,
        resumed_trials=len(opened.trials),
        experiment_id=opened.tracked.experiment_id,
        experiment_name=opened.tracked.name,
        final=chosen,
        objective=obj,
        screen=parts.screen.summary() if parts.screen is not None else None,
        clock=clock,
    )


def _finish(out: Outcome, opened: Opened, evaluator: str) -> None:
    """Record the front, where the time went and what the screens did; the experiment's status."""
    tracked = opened.tracked
    if tracked.store is None or tracked.experiment_id is None:
        return
    points = [front_point(t) for t in out.front]
    tracked.store.add_front(
        tracked.experiment_id, evaluator, points, out.hypervolume, len(out.trials), axes=out.objective.axes
    )
    extra: dict[str, Any] = {"phase_s": out.clock.snapshot(), "beside_s": out.clock.beside_snapshot()}
    first = out.clock.marks.get("first_feasible")
    if first is not None:  # (none for a search resumed with one already, or one that found none)
        extra["first_feasible"] = first.to_json()
    if out.screen is not None:
        extra["screen_counts"] = out.screen.to_json()
    tracked.set_status(ExperimentStatus.COMPLETE if out.chosen is not None else ExperimentStatus.INFEASIBLE, **extra)
