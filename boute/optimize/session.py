"""One optimisation run end to end: space, screens, evaluator, strategy, tracking, resume, choice, confirmation.

The CLI and the bench both call :func:`optimize`; it owns no I/O beyond the tracking store and the
``on_trial`` callback (the CLI's progress bar), so the plan file is written by the caller.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from boute.errors import InfeasibleError
from boute.optimize.evaluators import EvalResult, Evaluator, candidate_plan, make_evaluator
from boute.optimize.loop import run_search, targets_of
from boute.optimize.objectives import Objective, make_objective
from boute.optimize.parallel import EvaluatorPool
from boute.optimize.registry import make_strategy
from boute.optimize.result import SCREENED, Trial, choose, figures, hypervolume, hypervolume3, pareto_front
from boute.optimize.screen import Screen
from boute.optimize.space import Candidate, Space
from boute.specs import Plan, Prediction, ReplicaGroup, Scenario


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


def trial_row(t: Trial) -> dict[str, Any]:
    c = t.candidate
    return {
        "index": t.index,
        "status": t.status,
        "evaluator": t.result.evaluator if t.result else ("screen" if t.status == SCREENED else ""),
        "params": {
            "x": list(t.x),
            "z": list(t.z),
            "fractions": list(c.fractions),
            "deployment": [g.model_dump(mode="json") for g in c.deployment],
            "cost_per_hour": c.cost_per_hour,
        },
        "metrics": t.result.to_dict() if t.result else None,
        "error": t.error,
        "wall_s": t.result.wall_s if t.result else 0.0,
    }


def trial_from_row(row: Any) -> Trial:
    p = row.params
    cand = Candidate(
        tuple(p["fractions"]), tuple(ReplicaGroup(**g) for g in p["deployment"]), float(p["cost_per_hour"])
    )
    res = EvalResult.from_dict(row.metrics) if row.metrics else None
    return Trial(row.index, tuple(p["x"]), tuple(p["z"]), cand, res, status=row.status, error=row.error)


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


@dataclass
class Outcome:
    space: Space
    trials: list[Trial]
    chosen: Trial | None
    closest: Trial | None
    front: list[Trial]
    hypervolume: float
    resumed_trials: int = 0
    experiment_id: int | None = None
    experiment_name: str | None = None
    confirmed: dict[int, EvalResult] = field(default_factory=dict)  # trial index -> confirming result
    confirmations: list[Trial] = field(default_factory=list)  # the confirming evaluations, as trials
    final: Trial | None = None  # the plan written: chosen, or the confirmation's pick (None: none confirmed)
    objective: Objective = field(default_factory=Objective)
    screen: dict[str, dict[str, int]] | None = None  # ScreenCounts of the search's proposals and MOBO's pool
    confirm_closest: Trial | None = None  # when no confirmed plan meets the targets: the closest confirmed

    @property
    def evaluations(self) -> int:
        """Trials that cost an evaluation (screened ones did not)."""
        return sum(t.evaluated for t in self.trials)

    @property
    def screened(self) -> int:
        return len(self.trials) - self.evaluations

    def infeasible_message(self) -> str:
        tg = targets_of(self.space)
        head = (
            f"no plan meets quality >= {tg.quality_floor:g} and P95 <= {tg.p95_cap_s:g} s within "
            f"${tg.budget:g}/h after {self.evaluations} evaluations"
        )
        if self.closest is None or self.closest.result is None:
            return head
        r = self.closest.result
        return (
            f"{head}; closest: quality {r.quality:.4f}, P95 {r.p95_latency_s:.3g} s, ${r.cost_per_hour:.2f}/h "
            f"(trial {self.closest.index}); relax --quality-floor/--p95-cap or raise --budget"
        )

    def unconfirmed_message(self) -> str:
        """Why nothing is written when the confirming evaluator rejects every plan it checked."""
        tg = targets_of(self.space)
        n = sum(t.result is not None for t in self.confirmations)
        ev = next((t.result.evaluator for t in self.confirmations if t.result is not None), "the confirmation")
        head = (
            f"no plan meets quality >= {tg.quality_floor:g} and P95 <= {tg.p95_cap_s:g} s within "
            f"${tg.budget:g}/h by {ev}: {n} plans confirmed after {self.evaluations} searched"
        )
        t = self.confirm_closest
        if t is None:
            return f"{head}; no plan could be confirmed; retry with more --max-confirm or --no-confirm"
        r = self.confirmed[t.index]
        s = t.result
        fast = f" ({s.evaluator}: P95 {s.p95_latency_s:.3g} s)" if s is not None and s.evaluator != r.evaluator else ""
        return (
            f"{head}; closest: quality {r.quality:.4f}, P95 {r.p95_latency_s:.3g} s{fast}, "
            f"${r.cost_per_hour:.2f}/h (trial {t.index}); raise --max-confirm, relax the targets or raise --budget"
        )


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
    workers: int = 1,
    time_budget_s: float | None = None,
) -> Outcome:
    """Search, record, choose. ``objective``/``prefer``: :mod:`boute.optimize.objectives`; ``screen``: project
    proposals onto the quality floor and drop plans over the capacity bound (:mod:`boute.optimize.screen`).

    ``prior``: a cheaper evaluator (the fast path) whose P95 MOBO's GP corrects: the search evaluator (the
    simulator) is the objective and the GP models only its discrepancy from the prior, plan by plan.
    ``batch``/``workers``: proposals per step and the processes evaluating them (:mod:`boute.optimize.parallel`);
    ``time_budget_s``: stop asking new proposals after this many seconds of search.
    """
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
    scr = Screen.build(space, ev.quality_model, getattr(ev, "mode", mode)) if screen else None
    trials: list[Trial] = []
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
        store.set_status(exp_id, "running", max_evals=max_evals)
    resumed = len(trials)

    def record(t: Trial) -> None:
        if store is not None:
            store.add_trial(exp_id, trial_row(t))
        if on_trial is not None:
            on_trial(t, trials)

    min_trials = getattr(strat, "n_init", 0) + 1
    with EvaluatorPool(ev, scenario, seed, workers=workers) as pool:
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
        )
    tg = targets_of(space)
    chosen, closest = choose(done, tg, obj)
    front = pareto_front(done, obj, tg)
    _, q, p, c = figures(done)
    hv = hypervolume(q, p, tg) if obj.name == "latency" else hypervolume3(q, p, c, tg)
    out = Outcome(space, done, chosen, closest, front, hv, resumed, exp_id, name, final=chosen, objective=obj)
    out.screen = scr.summary() if scr is not None else None
    if store is not None:
        store.add_front(exp_id, ev.name, [front_point(t) for t in front], hv, len(done), axes=obj.axes)
        extra = {"screen_counts": out.screen} if out.screen is not None else {}
        store.set_status(exp_id, "complete" if chosen is not None else "infeasible", **extra)
    return out


def front_point(t: Trial) -> dict[str, Any]:
    r = t.result
    assert r is not None
    return {
        "trial": t.index,
        "quality": r.quality,
        "p95_latency_s": r.p95_latency_s,
        "throughput_rps": r.throughput_rps,
        "cost_per_hour": r.cost_per_hour,
        "fractions": list(t.candidate.fractions),
        "deployment": [g.model_dump(mode="json") for g in t.candidate.deployment],
    }


def confirm(
    out: Outcome,
    evaluator: Evaluator,
    max_points: int = 4,
    store: Any = None,
    **options: Any,
) -> None:
    """Re-check the answer with a more faithful evaluator; only a plan it confirms can be written.

    See :mod:`boute.optimize.confirm` (``options``: ``max_evals``, ``seed``, ``strategy_options``): the best
    plans meeting the targets are confirmed first, then the search continues with the confirming evaluator
    if none passes; ``out.final`` is None when nothing confirmed meets the targets.
    """
    from boute.optimize.confirm import confirm as run_confirm

    run_confirm(out, evaluator, max_points, store, **options)
    if store is not None and out.experiment_id is not None and out.final is None:
        store.set_status(out.experiment_id, "unconfirmed")


def build_plan(scenario: Scenario, out: Outcome, mode: str, router: str | None = None) -> Plan:
    """The final plan, routed by ``router`` (the search's quality model's, whose scores its thresholds cut)."""
    t = out.final
    assert t is not None and t.result is not None
    r = out.confirmed.get(t.index, t.result)
    plan = candidate_plan(scenario, t.candidate, mode, t.result.thresholds or None, router=router)
    q = (r.extra or {}).get("quality") or {}  # an exact quality model's mean and bound (quality_summary)
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
    its own shares, keyed by tier, which are not a prediction)."""
    shares = (r.extra or {}).get("tier_shares")
    return [float(v) for v in shares] if isinstance(shares, list) else None
