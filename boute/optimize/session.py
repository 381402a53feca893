"""One search end to end: space, screens, evaluator, strategy, tracking, resume, choice; then the plan.

:func:`optimize` builds the space, the evaluator's screens and the strategy, resumes the experiment's trials
from the tracking store, runs the loop (:func:`boute.optimize.loop.run_search`) and chooses
(:mod:`boute.optimize.trials`): an :class:`~boute.optimize.outcome.Outcome`. Confirmation
(:func:`boute.optimize.confirm.confirm`) completes it, :func:`build_plan` turns it into the plan to write.
It owns no I/O beyond the tracking store and the ``on_trial`` callback (the CLI's progress bar), so the
plan file is written by the caller (:func:`boute.optimize.plan_run.make_plan`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from boute.errors import InfeasibleError
from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import EvalResult, Evaluator, candidate_plan
from boute.optimize.evaluators.pool import EvaluatorPool
from boute.optimize.evaluators.ray_pool import RayEvaluatorPool
from boute.optimize.loop import run_search
from boute.optimize.objectives import Objective, make_objective
from boute.optimize.outcome import Outcome
from boute.optimize.records import front_point, trial_from_row, trial_row
from boute.optimize.registry import make_evaluator, make_strategy
from boute.optimize.screen import Screen
from boute.optimize.space import Space
from boute.optimize.trials import Trial, choose, figures, hypervolume, hypervolume3, pareto_front
from boute.specs import Plan, Prediction, Scenario


def with_targets(scenario: Scenario, budget: float | None, floor: float | None, cap: float | None) -> Scenario:
    """The scenario with CLI overrides of budget, quality floor and P95 cap."""
    upd: dict[str, Any] = {}
    if budget is not None:
        upd["cluster"] = scenario.cluster.model_copy(update={"budget_per_hour": float(budget)})
    t: dict[str, Any] = {}
    if floor is not None:
        t["quality_floor"] = float(floor)
    if cap is not None:
        t["p95_latency_s"] = float(cap)
    if t:
        upd["targets"] = scenario.targets.model_copy(update=t)
    return scenario.model_copy(update=upd) if upd else scenario


def perf_fingerprint(scenario: Scenario) -> str:
    """What every evaluation's timings rest on: the packaged perf fit and the scenario's GPU catalog with its
    calibration applied. Part of an experiment's settings, so trials evaluated under another perf model (a
    BOute upgrade, a new calibration file) are never resumed as if they were this model's."""
    from boute.perf.calibration import scenario_catalog
    from boute.perf.structure import packaged_fit

    cat = scenario_catalog(scenario)
    doc = {"fit": packaged_fit().to_json(), "gpus": {n: g.model_dump(mode="json") for n, g in sorted(cat.gpus.items())}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:12]


def settings_of(
    scenario: Scenario,
    mode: str,
    gpus: tuple[str, ...] | None,
    objective: Objective | None = None,
    screen: bool = True,
) -> dict[str, Any]:
    """What an experiment was run with (a resume must match). The objective and ``screen: false`` are
    recorded only when they differ from the defaults, so experiments tracked before they existed resume;
    ``perf_sha`` is always recorded, so an experiment of another perf model never does."""
    doc = scenario.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]
    extra: dict[str, Any] = {}
    if objective is not None and objective.label != "latency":
        extra["objective"] = objective.label
    if not screen:
        extra["screen"] = False
    return {
        **extra,
        "scenario_sha": digest,
        "perf_sha": perf_fingerprint(scenario),
        "budget_per_hour": scenario.cluster.budget_per_hour,
        "quality_floor": scenario.targets.quality_floor,
        "p95_cap_s": scenario.targets.p95_latency_s,
        "mode": mode,
        "gpus": list(gpus) if gpus else None,
    }


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


def optimize(
    scenario: Scenario,
    *,
    strategy: str = "mobo",
    evaluator: str | Evaluator = "fast",
    max_evals: int = 60,
    seed: int = 0,
    mode: str = "preroute",
    patience: int | None = 20,
    gpus: tuple[str, ...] | None = None,
    store: Any = None,
    experiment: str | None = None,
    on_trial: Callable[[Trial, list[Trial]], None] | None = None,
    strategy_options: dict[str, Any] | None = None,
    objective: str | Objective = "latency",
    prefer: str | None = None,
    screen: bool = True,
    prior: Evaluator | None = None,
    batch: int = 1,
    workers: int | None = 1,
    ray_address: str | None = None,
    time_budget_s: float | None = None,
    start: Sequence[Trial] = (),
    clock: SearchClock | None = None,
) -> Outcome:
    """Search, record, choose. ``objective``/``prefer``: :mod:`boute.optimize.objectives`; ``screen``: project
    proposals onto the quality floor and drop plans over the capacity bound (:mod:`boute.optimize.screen`).

    ``prior``: a cheaper evaluator (the fast path) whose P95 MOBO's GP corrects: the search evaluator (the
    simulator) is the objective and the GP models only its discrepancy from the prior, plan by plan.
    ``batch``/``workers``: proposals per step and the processes evaluating them
    (:mod:`boute.optimize.evaluators.pool`; None: one per core); ``ray_address``: evaluate on that Ray
    cluster's actors instead (:mod:`boute.optimize.evaluators.ray_pool`; ``workers`` None: one per CPU);
    ``time_budget_s``: stop asking new proposals after this many seconds of search.
    ``start``: trials of a related search valid in this space (the same scenario at another budget, say) that
    this one starts from when no stored trials resume it; they count towards ``max_evals`` like resumed ones.
    ``clock``: where the search's time goes (:mod:`boute.optimize.clock`), read live by a progress bar; the
    phases are kept on the outcome and recorded with the experiment (``phase_s``).
    """
    clock = clock if clock is not None else SearchClock()
    t_setup = time.perf_counter()
    deadline = None if time_budget_s is None else time.monotonic() + float(time_budget_s)
    obj = objective if isinstance(objective, Objective) else make_objective(objective, prefer)
    space = Space.build(scenario, gpus=gpus)
    ev = make_evaluator(evaluator, scenario, mode, seed) if isinstance(evaluator, str) else evaluator
    check_targets_reachable(scenario, ev)
    if strategy == "mobo" and ev.quality_model is None:
        strategy = "mobo-gp"  # no exact quality to model: learn it too (recorded under its own name)
    options: dict[str, Any] = {"objective": obj, **(strategy_options or {})}
    if prior is not None and strategy == "mobo" and prior.fidelity < ev.fidelity:
        fast = prior
        options["prior"] = lambda cand: fast(cand).p95_latency_s
    strat = make_strategy(strategy, space, seed, **options)
    scr = Screen.build(space, ev.quality_model, ev.mode) if screen else None
    trials: list[Trial] = []
    warm = 0  # trials taken from ``start``
    exp_id = None
    name = experiment
    if store is not None:
        settings = settings_of(scenario, mode, gpus, obj, screen)
        if name is None:
            tag = hashlib.sha256(json.dumps([settings, strategy, ev.name, seed], sort_keys=True).encode()).hexdigest()
            name = f"{scenario.name}-{strategy}-{ev.name}-s{seed}-{tag[:8]}"
        exp, _ = store.open_experiment(
            name, scenario=scenario.name, strategy=strategy, evaluator=ev.name, seed=seed, settings=settings
        )
        exp_id = exp.id
        trials = [trial_from_row(r) for r in store.trial_rows(exp_id)]
        warm = int(exp.settings.get("warm_start", 0)) if trials else 0  # a resumed warm start keeps its count
        store.set_status(exp_id, "running", max_evals=max_evals)
    if not trials and start:  # a warm start is recorded like the search's own trials, so a resume has it
        # numbered from 0 as this search's own trials; only evaluated ones count towards min_trials
        trials = [replace(t, index=i) for i, t in enumerate(start)]
        warm = sum(t.evaluated for t in trials)
        if store is not None:  # the count first: a resume after a crash in between overcounts, never forgets
            store.set_status(exp_id, "running", warm_start=warm)
            for t in trials:
                store.add_trial(exp_id, trial_row(t))
    resumed = len(trials)

    def record(t: Trial) -> None:
        if store is not None:
            store.add_trial(exp_id, trial_row(t))
        if on_trial is not None:
            on_trial(t, trials)

    # never converged inside the initial design, nor before a warm start's first evaluation of its own
    min_trials = max(strat.n_init, warm) + 1
    runner = (
        EvaluatorPool(ev, scenario, seed, workers=workers)
        if ray_address is None
        else RayEvaluatorPool(ev, scenario, seed, address=ray_address, workers=workers)
    )
    with runner as pool:
        clock.add("setup", time.perf_counter() - t_setup)
        done = run_search(
            space,
            ev,
            strat,
            max_evals=max_evals,
            trials=trials,
            patience=patience,
            min_trials=min_trials,
            on_trial=record,
            objective=obj,
            screen=scr,
            batch=batch,
            pool=pool,
            deadline=deadline,
            clock=clock,
        )
    tg = space.scenario.goal
    chosen, closest = choose(done, tg, obj)
    front = pareto_front(done, obj, tg)
    _, q, p, c = figures(done)
    hv = hypervolume(q, p, tg) if obj.name == "latency" else hypervolume3(q, p, c, tg)
    out = Outcome(
        space, done, chosen, closest, front, hv, resumed, exp_id, name, final=chosen, objective=obj, clock=clock
    )
    out.screen = scr.summary() if scr is not None else None
    if store is not None:
        store.add_front(exp_id, ev.name, [front_point(t) for t in front], hv, len(done), axes=obj.axes)
        extra: dict[str, Any] = {"phase_s": clock.snapshot()}
        if out.screen is not None:
            extra["screen_counts"] = out.screen
        store.set_status(exp_id, "complete" if chosen is not None else "infeasible", **extra)
    return out


def build_plan(
    scenario: Scenario,
    out: Outcome,
    mode: str,
    router: str | None = None,
    verifier: str | None = None,
    judge_model: str | None = None,
    scorer: str = "ladder",
) -> Plan:
    """The final plan, routed by ``router`` (a ``scorer``: ``ladder`` or ``multi``) or (a
    cascade) judged by ``verifier`` or the LLM judge ``judge_model``: the search's quality model's router or
    judge, on whose scores its thresholds (or prices) were cut."""
    t = out.final
    assert t is not None and t.result is not None
    r = out.confirmed.get(t.index, t.result)
    cut = t.result.thresholds or None
    plan = candidate_plan(
        scenario,
        t.candidate,
        mode,
        cut,
        router=router,
        verifier=verifier,
        judge_model=judge_model,
        scorer=scorer,
        prices=t.result.prices,
    )
    q = r.extra.quality or {}  # an exact quality model's held-out mean and bound (a live result has none)
    pred = Prediction(
        quality=q.get("mean", r.quality),
        quality_bound=q.get("bound"),
        quality_confidence=q.get("level"),
        floor_on=scenario.targets.floor_on,
        p95_latency_s=r.p95_latency_s,
        p50_latency_s=r.p50_latency_s,
        mean_latency_s=r.mean_latency_s,
        throughput_rps=r.throughput_rps,
        cost_per_hour=r.cost_per_hour,
        evaluator=r.evaluator,
        feasible=r.feasible,
        tier_shares=_held_out_shares(r) or _held_out_shares(t.result),
    )
    return plan.model_copy(update={"predicted": pred, "objective": out.objective.label})


def _held_out_shares(r: EvalResult) -> list[float] | None:
    """The quality model's per-tier shares on its held-out prompts (exact evaluators; a live result measures
    the shares its answers came from, ``answered_shares``, which are not a prediction)."""
    shares = r.extra.tier_shares
    return None if shares is None else list(shares)
