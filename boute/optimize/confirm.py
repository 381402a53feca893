"""Confirmation: a more faithful evaluator re-checks the search's answer before a plan is written.

The search evaluator (the fast path, usually) can be wrong where its approximation is weak; a plan it
puts under the P95 cap may not be. So before a plan is written, the confirming evaluator (the event
simulator, or live deployments) re-evaluates it, and **only a plan the confirming evaluator finds meeting
the targets can be the answer**:

1. Confirm up to ``max_points`` distinct plans the search found meeting the targets, best first by the
   objective. For ``cost`` each next plan also has more P95 headroom than every earlier one (the cost x P95
   staircase): if the cheapest plan fails, the next one to try is the one likelier to pass at the least
   extra cost.
2. If the search's own answer (the first of them) fails, the search evaluator is wrong around there: the
   search continues *with the confirming evaluator*, warm-started from the confirmed results (MOBO with the
   same objective and screens, its GP now trained on the faithful figures), until the confirmed choice
   has not changed for ``CONFIRM_PATIENCE`` evaluations, or ``max_evals`` confirming evaluations in all are
   spent. With ``prior`` (the search evaluator, when it is cheap), that GP models only the discrepancy
   between the confirming evaluator and ``prior``, plan by plan (:class:`boute.optimize.strategies.mobo.MoboStrategy`),
   so each faithful result corrects the search evaluator's figures for the whole space.
3. The answer is the objective's pick among plans the confirming evaluator found meeting the targets; if
   there is none, the returned outcome's :attr:`Outcome.final` is None and the caller reports the closest
   confirmed plan (``boute optimize`` exits 2 and writes nothing); the experiment's status becomes
   ``unconfirmed``.

Every confirming evaluation is recorded as a trial of the experiment after the searched ones: status
``confirmed`` (a re-check of a search trial) or ``confirm-search`` (a plan the continued search proposed)
(:class:`~boute.optimize.status.TrialStatus`), with the confirming evaluator's name. Strategies never train
on them in later runs (they are not ``complete``). The logic uses only the evaluator protocol (results of two evaluators of rising fidelity).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from boute.errors import BouteError
from boute.optimize.evaluators.base import EvalResult, Evaluator
from boute.optimize.experiment import TrackedExperiment
from boute.optimize.loop import LoopHooks, run_search
from boute.optimize.objectives import Objective
from boute.optimize.outcome import Outcome
from boute.optimize.screen import Screen
from boute.optimize.settings import SearchSettings
from boute.optimize.space import Candidate
from boute.optimize.status import ExperimentStatus, TrialStatus
from boute.optimize.strategies.factory import make_strategy
from boute.optimize.trial_store import TrialStore
from boute.optimize.trials import Trial, feasible_mask, figures
from boute.quality.policy_quality import QualityModel
from boute.specs.targets import Targets
from boute.workload import Workload

#: confirming evaluations of the continued search with an unchanged answer before it stops
CONFIRM_PATIENCE = 4
#: front points whose deployments match and whose routing fractions differ by less than this are one plan
#: for confirmation purposes: confirming four near-copies of one plan tells nothing about the others
SAME_PLAN_FRACTION_TOL = 0.02


def distinct(pool: Sequence[Trial], k: int) -> list[Trial]:
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


def candidates(trials: Sequence[Trial], objective: Objective, targets: Targets) -> list[Trial]:
    """Search trials meeting the targets, in the order confirmation tries them (module doc, step 1)."""
    ok = [t for t in trials if t.ok]
    feas, q, p, c = figures([t for t, m in zip(ok, feasible_mask(ok, targets), strict=True) if m])
    if not feas:
        return []
    ranked = [feas[i] for i in objective.order(q, p, c, targets)]
    if objective.name != "cost":
        return ranked
    # cost: the staircase. A costlier plan with no more P95 headroom than a cheaper one already tried is
    # no likelier to pass where that one failed, so it is skipped
    out: list[Trial] = []
    for t in ranked:
        if all(u.checked_result.p95_latency_s > t.checked_result.p95_latency_s for u in out):
            out.append(t)
    return out


@dataclass
class _Confirming:
    """A confirmation under way: its evaluations as trials (recorded as they come) and its results by the
    index of the search trial (or continued-search trial) whose plan they judged."""

    out: Outcome
    tracked: TrackedExperiment
    confirmations: list[Trial] = field(default_factory=list)
    confirmed: dict[int, EvalResult] = field(default_factory=dict)

    def record(self, row: Trial) -> None:
        self.confirmations.append(row)
        self.tracked.add_trial(row)

    def next_index(self) -> int:
        return len(self.out.trials) + len(self.confirmations)


def confirm(
    out: Outcome,
    evaluator: Evaluator,
    max_points: int = 4,
    store: TrialStore | None = None,
    *,
    max_evals: int | None = None,
    seed: int = 0,
    strategy_options: Mapping[str, Any] | None = None,
    prior: Evaluator | None = None,
) -> Outcome:
    """``out`` confirmed with ``evaluator`` (module doc): a new outcome whose ``final`` is the confirmed
    answer (None: nothing confirmed).

    ``store``: the tracking store (:func:`boute.tracking.open_store`) the confirmations are recorded in, as
    trials of ``out``'s experiment. ``max_evals``: confirming evaluations in all, re-checks and continued
    search (default ``3 * max_points``); ``max_evals <= max_points`` never continues the search. ``prior``:
    a cheap evaluator whose P95 the continued search corrects (module doc, step 2).
    """
    tg = out.space.scenario.goal
    budget = 3 * max_points if max_evals is None else max(1, max_evals)
    tracked = TrackedExperiment(store, out.experiment_id, out.experiment_name, out.clock)
    run = _Confirming(out, tracked)
    first = distinct(candidates(out.trials, out.objective, tg), min(max_points, budget))
    checked = _recheck(run, evaluator, first)  # the search trials whose plans were confirmed
    final, closest = _pick(out.objective, run.confirmed, checked, tg)
    # the search's own answer failed its confirmation: the search evaluator is wrong around here, so the
    # rest of the budget goes to searching with the confirming evaluator (for a better plan than the
    # confirmed runner-up, or for any plan at all)
    top = run.confirmed.get(first[0].index) if first else None
    top_failed = bool(first) and (
        top is None or not tg.met_by(top.quality, top.p95_latency_s, top.cost_per_hour, top.quality_se)
    )
    if (final is None or top_failed) and budget > len(run.confirmations):
        _continue_search(run, evaluator, budget - len(run.confirmations), seed, strategy_options, prior)
        searched = [t for t in run.confirmations if t.status == TrialStatus.CONFIRM_SEARCH and t.result is not None]
        for t in searched:
            run.confirmed[t.index] = t.checked_result
        final, closest = _pick(out.objective, run.confirmed, checked + searched, tg)
    if final is None:
        tracked.set_status(ExperimentStatus.UNCONFIRMED)
    return out.confirmed_as(run.confirmed, run.confirmations, final, closest)


def _recheck(run: _Confirming, evaluator: Evaluator, first: Sequence[Trial]) -> list[Trial]:
    """Re-evaluate the plans of ``first`` (module doc, step 1); the ones that gave a result."""
    checked: list[Trial] = []
    for t in first:
        index = run.next_index()
        try:
            res = evaluator(t.candidate)
        except Exception as exc:
            run.record(Trial(index, t.x, t.z, t.candidate, None, status=TrialStatus.FAILED, error=f"confirm: {exc}"))
            continue
        run.confirmed[t.index] = res
        checked.append(t)
        run.record(Trial(index, t.x, t.z, t.candidate, res, status=TrialStatus.CONFIRMED))
    return checked


def _pick(
    objective: Objective, confirmed: Mapping[int, EvalResult], checked: list[Trial], tg: Targets
) -> tuple[Trial | None, Trial | None]:
    """``(final, closest)``: the objective's pick among confirmed plans meeting the targets and, when none
    does, the closest confirmed one (both None when nothing was confirmed)."""
    res = [confirmed[t.index] for t in checked]
    if not res:
        return None, None
    q = np.array([r.quality for r in res])
    p = np.array([r.p95_latency_s for r in res])
    c = np.array([r.cost_per_hour for r in res])
    feas = tg.mask(q, p, c, [r.quality_se for r in res])
    i = objective.pick(q, p, c, feas, tg)
    if i is None:
        return None, checked[int(np.argmin(tg.violation(q, p, c)))]
    return checked[i], None


class _Guarded:
    """The confirming evaluator with any error turned into a failed trial (a plan it cannot run is not
    confirmed), as the re-checks treat it; the harness records ``BouteError`` as a failed trial."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.inner = evaluator
        self.name: str = evaluator.name
        self.fidelity: int = evaluator.fidelity
        self.mode: str = evaluator.mode
        self.quality_model: QualityModel | None = evaluator.quality_model
        self.workload: Workload | None = evaluator.workload

    def __call__(self, cand: Candidate) -> EvalResult:
        try:
            return self.inner(cand)
        except BouteError:
            raise
        except Exception as exc:
            raise BouteError(f"confirm: {exc}") from exc

    def close(self) -> None:
        """The caller owns (and closes) the wrapped evaluator."""


def _continue_search(
    run: _Confirming,
    evaluator: Evaluator,
    n: int,
    seed: int,
    strategy_options: Mapping[str, Any] | None,
    prior: Evaluator | None = None,
) -> None:
    """Search on with the confirming evaluator, warm-started from the confirmations (module doc, step 2)."""
    out = run.out
    space = out.space
    base = len(out.trials)
    # the confirmations so far, as the history of a search with the confirming evaluator (local indices)
    history = [
        Trial(
            i,
            t.x,
            t.z,
            t.candidate,
            t.result,
            status=TrialStatus.COMPLETE if t.result is not None else TrialStatus.FAILED,
            error=t.error,
        )
        for i, t in enumerate(run.confirmations)
    ]
    opts = {k: v for k, v in (strategy_options or {}).items() if k != "n_init"}
    if prior is not None and evaluator.quality_model is not None:  # (the GP-quality fallback takes no prior)
        opts["prior"] = lambda cand: prior(cand).p95_latency_s
    strat = make_strategy("mobo", space, seed, n_init=0, objective=out.objective, **opts)
    screen = Screen.build(space, evaluator.quality_model, evaluator.mode, evaluator.workload)

    def on_trial(t: Trial) -> None:
        status = t.status if t.status != TrialStatus.COMPLETE else TrialStatus.CONFIRM_SEARCH
        run.record(Trial(base + t.index, t.x, t.z, t.candidate, t.result, status=status, error=t.error))

    # one proposal a step, evaluated here, each with every result before it; the objective and seed the search had
    settings = SearchSettings(
        max_evals=len(history) + n,
        patience=CONFIRM_PATIENCE,
        batch=1,
        workers=1,
        pipeline=False,
        seed=seed,
        mode=evaluator.mode,
        objective=out.objective.name,
        prefer=out.objective.prefer_option,
    )
    run_search(
        space,
        _Guarded(evaluator),
        strat,
        settings,
        trials=history,
        min_trials=len(history) + 1,
        screen=screen,
        hooks=LoopHooks(on_trial=on_trial),
    )
