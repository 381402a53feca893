"""One optimisation run end to end: space, evaluator, strategy, tracking, resume, choice, confirmation.

The CLI and the bench both call :func:`optimize`; it owns no I/O beyond the tracking store and the
``on_trial`` callback (the CLI's progress bar), so the plan file is written by the caller.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from boute.errors import InfeasibleError
from boute.optimize.evaluators import EvalResult, Evaluator, candidate_plan, make_evaluator
from boute.optimize.loop import run_search, targets_of
from boute.optimize.registry import make_strategy
from boute.optimize.result import Trial, choose, hypervolume, pareto_front
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
        "evaluator": t.result.evaluator if t.result else "",
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


def trial_from_row(row: Any) -> Trial:  # noqa: ANN401 - TrialRow
    p = row.params
    cand = Candidate(
        tuple(p["fractions"]), tuple(ReplicaGroup(**g) for g in p["deployment"]), float(p["cost_per_hour"])
    )
    res = EvalResult.from_dict(row.metrics) if row.metrics else None
    return Trial(row.index, tuple(p["x"]), tuple(p["z"]), cand, res, status=row.status, error=row.error)


def settings_of(scenario: Scenario, mode: str, gpus: tuple[str, ...] | None) -> dict[str, Any]:
    doc = scenario.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]
    return {
        "scenario_sha": digest,
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
    final: Trial | None = None  # the plan written (chosen, or the first front point the simulator confirms)

    def infeasible_message(self) -> str:
        tg = targets_of(self.space)
        head = (
            f"no plan meets quality >= {tg.quality_floor:g} and P95 <= {tg.p95_cap_s:g} s within "
            f"${tg.budget:g}/h after {len(self.trials)} evaluations"
        )
        if self.closest is None or self.closest.result is None:
            return head
        r = self.closest.result
        return (
            f"{head}; closest: quality {r.quality:.4f}, P95 {r.p95_latency_s:.3g} s, ${r.cost_per_hour:.2f}/h "
            f"(trial {self.closest.index}); relax --quality-floor/--p95-cap or raise --budget"
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
    store: Any = None,  # noqa: ANN401 - boute.tracking.Store
    experiment: str | None = None,
    on_trial: Callable[[Trial, list[Trial]], None] | None = None,
    strategy_options: dict[str, Any] | None = None,
) -> Outcome:
    space = Space.build(scenario, gpus=gpus)
    ev = make_evaluator(evaluator, scenario, mode, seed) if isinstance(evaluator, str) else evaluator
    check_targets_reachable(scenario, ev)
    if strategy == "mobo" and ev.quality_model is None:
        strategy = "mobo-gp"  # no exact quality to model: learn it too (recorded under its own name)
    strat = make_strategy(strategy, space, seed, **(strategy_options or {}))
    trials: list[Trial] = []
    exp_id = None
    name = experiment
    if store is not None:
        settings = settings_of(scenario, mode, gpus)
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
    done = run_search(
        space, ev, strat, max_evals=max_evals, trials=trials, patience=patience, min_trials=min_trials, on_trial=record
    )
    tg = targets_of(space)
    chosen, closest = choose(done, tg)
    front = pareto_front(done)
    ok = [t for t in done if t.ok]
    hv = hypervolume([t.result.quality for t in ok], [t.result.p95_latency_s for t in ok], tg)  # type: ignore[misc,union-attr]
    out = Outcome(space, done, chosen, closest, front, hv, resumed, exp_id, name, final=chosen)
    if store is not None:
        store.add_front(exp_id, ev.name, [front_point(t) for t in front], hv, len(done))
        store.set_status(exp_id, "complete" if chosen is not None else "infeasible")
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
    store: Any = None,  # noqa: ANN401 - boute.tracking.Store
) -> None:
    """Re-evaluate the chosen plan and the best feasible front points with a costlier evaluator.

    ``evaluator`` is the event simulator by default, or the live one (deploy and measure): a run may screen
    with ``fast`` and confirm with ``live``. The final plan is the lowest-P95 plan the confirmation finds
    meeting the targets; if it confirms none, the chosen plan stays (with its confirmed figures reported).
    With a store, each confirmation is also a trial of the experiment (status ``confirmed``, its own
    evaluator's name), so the experiment shows which evaluator measured what; strategies never learn from
    them (they are not ``complete``), and a confirmation that fails is recorded as such and skipped.
    """
    tg = targets_of(out.space)
    pool = [t for t in out.front if t.result and tg.met_by(t.result.quality, 0.0, 0.0)]  # the floor alone
    pool.sort(key=lambda t: t.result.p95_latency_s)  # type: ignore[union-attr]
    if out.chosen is not None and out.chosen not in pool:
        pool.insert(0, out.chosen)
    checked: list[Trial] = []
    for t in _distinct(pool, max_points):
        index = len(out.trials) + len(out.confirmations)
        try:
            res = evaluator(t.candidate)
        except Exception as exc:  # noqa: BLE001 - a plan the confirming evaluator cannot run is not confirmed
            row = Trial(index, t.x, t.z, t.candidate, None, status="failed", error=f"confirm: {exc}")
        else:
            out.confirmed[t.index] = res
            checked.append(t)
            row = Trial(index, t.x, t.z, t.candidate, res, status="confirmed")
        out.confirmations.append(row)
        if store is not None and out.experiment_id is not None:
            store.add_trial(out.experiment_id, trial_row(row))
    ok = [t for t in checked if out.confirmed[t.index].feasible]
    if ok:
        out.final = min(ok, key=lambda t: out.confirmed[t.index].p95_latency_s)


#: front points whose deployments match and whose routing fractions differ by less than this are one plan
#: for confirmation purposes: confirming four near-copies of one plan tells nothing about the others
SAME_PLAN_FRACTION_TOL = 0.02


def _distinct(pool: list[Trial], k: int) -> list[Trial]:
    """The first ``k`` trials of ``pool`` that are not near-copies of an earlier pick."""
    picked: list[Trial] = []
    for t in pool:
        c = t.candidate
        if any(
            u.candidate.deployment == c.deployment
            and max(abs(a - b) for a, b in zip(u.candidate.fractions, c.fractions, strict=True))
            < SAME_PLAN_FRACTION_TOL
            for u in picked
        ):
            continue
        picked.append(t)
        if len(picked) == k:
            break
    return picked


def build_plan(scenario: Scenario, out: Outcome, mode: str) -> Plan:
    t = out.final
    assert t is not None and t.result is not None
    r = out.confirmed.get(t.index, t.result)
    plan = candidate_plan(scenario, t.candidate, mode, t.result.thresholds or None)
    pred = Prediction(
        quality=r.quality,
        p95_latency_s=r.p95_latency_s,
        p50_latency_s=r.p50_latency_s,
        mean_latency_s=r.mean_latency_s,
        throughput_rps=r.throughput_rps,
        cost_per_hour=r.cost_per_hour,
        evaluator=r.evaluator,
        feasible=r.feasible,
    )
    return plan.model_copy(update={"predicted": pred})
