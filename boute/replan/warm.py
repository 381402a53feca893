"""Warm start: what earlier searches evaluated, re-scored under the observed workload, seeds the new one.

The tracking DB holds every plan an earlier search evaluated. Under a new workload their old figures are
stale, but the plans are not: re-scoring them with the fast evaluator costs milliseconds each, and a
search that resumes from them (strategies are stateless over history, so a resumed search continues
from whatever trials it is handed) skips the initial design and starts from plans known to be near
the front. Plans the new fleet cannot hold (a lost GPU type) are mapped onto it by the space's own
repair, as any proposal is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from boute.optimize.evaluators import Evaluator
from boute.optimize.experiment import settings_of
from boute.optimize.records import trial_from_row, trial_row
from boute.optimize.settings import SearchSettings
from boute.optimize.space import Candidate, Space
from boute.optimize.status import ExperimentStatus, TrialStatus
from boute.optimize.trial_store import StoredTrial, TrialStore
from boute.optimize.trials import Trial
from boute.specs import Scenario

#: the trials whose plans a warm start re-scores: the search's evaluated ones and the confirmed re-checks
_RESCORED = frozenset({TrialStatus.COMPLETE, TrialStatus.CONFIRMED})


def _rank(row: StoredTrial) -> tuple[int, float]:
    """Plans that met the targets first, then by P95: the most promising are re-scored first."""
    m = row.metrics or {}
    p95 = float(m.get("p95_latency_s", math.inf))
    return (0 if m.get("feasible") else 1, p95)


def warm_trials(
    store: TrialStore,
    experiments: list[str],
    scenario: Scenario,
    evaluator: Evaluator,
    limit: int = 40,
    first: Sequence[Candidate] = (),
) -> list[Trial]:
    """Up to ``limit`` distinct plans, re-scored under ``scenario``: ``first`` (the running plan: a re-plan
    must be able to keep it), then the complete trials of ``experiments``, most promising first."""
    space = Space.build(scenario)
    rows: list[StoredTrial] = []
    for name in experiments:
        exp = store.experiment(name)
        if exp is not None:
            rows += [r for r in store.trial_rows(exp.id) if r.status in _RESCORED and r.metrics]
    out: list[Trial] = []
    seen: set[str] = set()
    candidates = [*first, *(trial_from_row(r).candidate for r in sorted(rows, key=_rank))]
    for raw in candidates:
        try:
            cand = space.decode(space.encode(raw))
        except (ValueError, KeyError, IndexError):
            continue  # a plan this space cannot express at all (another tier set)
        key = cand.key()
        if key in seen:
            continue
        seen.add(key)
        z = tuple(float(v) for v in space.encode(cand))
        out.append(Trial(len(out), z, z, cand, evaluator(cand)))
        if len(out) >= limit:
            break
    return out


def seed_experiment(store: TrialStore, scenario: Scenario, trials: list[Trial], settings: SearchSettings) -> None:
    """Create experiment ``settings.experiment`` holding ``trials``, so the search with ``settings`` (a
    :class:`~boute.optimize.plan_run.PlanRequest` holding them, ``boute optimize --experiment NAME``)
    resumes from them: it is recorded as that search records itself."""
    if settings.experiment is None:
        raise ValueError("seed_experiment: the settings name no experiment")
    exp, resumed = store.open_experiment(
        settings.experiment,
        scenario=scenario.name,
        strategy=settings.strategy,
        evaluator=settings.evaluator,
        seed=settings.seed,
        settings=settings_of(scenario, settings),
    )
    if resumed:
        return
    # recorded first: a search resuming these trials waits for one evaluation of its own (optimize's rule)
    store.set_status(exp.id, ExperimentStatus.RUNNING, warm_start=sum(t.evaluated for t in trials))
    for t in trials:
        store.add_trial(exp.id, trial_row(t))
