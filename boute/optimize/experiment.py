"""A search as the tracking DB records it: the experiment it opens or resumes, what it was run with, its trials.

An experiment is named (``--experiment``, or a name derived from what it was run with) and holds every trial
as it finishes, so rerunning the same search resumes from them. A resume must be the same search:
:func:`settings_of` is what the store compares (the scenario's digest, the perf model's, the targets, the
routing mode, the GPU set, the objective and the screens), and a warm start (trials of a related search a
new one starts from) is recorded like the search's own trials, its count first, so a resume has it too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from boute.optimize.clock import SearchClock
from boute.optimize.records import trial_from_row, trial_row
from boute.optimize.settings import SearchSettings
from boute.optimize.status import ExperimentStatus
from boute.optimize.trial_store import TrialStore
from boute.optimize.trials import Trial
from boute.specs import Scenario


def perf_fingerprint(scenario: Scenario) -> str:
    """What every evaluation's timings rest on: the packaged perf fit and the scenario's GPU catalog with its
    calibration applied. Part of an experiment's settings, so trials evaluated under another perf model (a
    BOute upgrade, a new calibration file) are never resumed as if they were this model's."""
    from boute.perf.calibration import scenario_catalog
    from boute.perf.structure import packaged_fit

    cat = scenario_catalog(scenario)
    doc = {"fit": packaged_fit().to_json(), "gpus": {n: g.model_dump(mode="json") for n, g in sorted(cat.gpus.items())}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:12]


def settings_of(scenario: Scenario, settings: SearchSettings) -> dict[str, Any]:
    """What an experiment was run with (a resume must match). The objective and ``screen: false`` are
    recorded only when they differ from the defaults, so experiments tracked before they existed resume;
    ``perf_sha`` is always recorded, so an experiment of another perf model never does."""
    doc = scenario.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]
    extra: dict[str, Any] = {}
    label = settings.chosen_by.label
    if label != "latency":
        extra["objective"] = label
    if not settings.screen:
        extra["screen"] = False
    return {
        **extra,
        "scenario_sha": digest,
        "perf_sha": perf_fingerprint(scenario),
        "budget_per_hour": scenario.cluster.budget_per_hour,
        "quality_floor": scenario.targets.quality_floor,
        "p95_cap_s": scenario.targets.p95_latency_s,
        "mode": settings.mode,
        "gpus": list(settings.gpus) if settings.gpus else None,
    }


@dataclass(frozen=True)
class TrackedExperiment:
    """Where a search's trials go: experiment ``experiment_id`` of ``store`` (both None: not tracked);
    ``clock``: the run's clock, whose elapsed seconds each trial is recorded with (None: not recorded)."""

    store: TrialStore | None
    experiment_id: int | None
    name: str | None
    clock: SearchClock | None = None

    def add_trial(self, t: Trial) -> None:
        if self.store is not None and self.experiment_id is not None:
            row = trial_row(t)
            if self.clock is not None:
                row["elapsed_s"] = round(self.clock.elapsed(), 3)
            self.store.add_trial(self.experiment_id, row)

    def set_status(self, status: ExperimentStatus, **records: Any) -> None:
        if self.store is not None and self.experiment_id is not None:
            self.store.set_status(self.experiment_id, status, **records)


@dataclass(frozen=True)
class Opened:
    """An experiment opened for a search: where its trials go, the trials it resumes from (its own stored
    ones, else the warm start's), and how many of those the warm start evaluated."""

    tracked: TrackedExperiment
    trials: list[Trial]
    warm: int


def open_experiment(
    store: TrialStore | None,
    scenario: Scenario,
    settings: SearchSettings,
    strategy: str,
    evaluator: str,
    start: Sequence[Trial] = (),
    clock: SearchClock | None = None,
) -> Opened:
    """Open (or resume) the experiment of a search with ``settings``, run as ``strategy`` with ``evaluator``
    (the names recorded), and record its warm start ``start`` when no stored trials resume it. ``clock``: the
    run's, set to go on from the wall time a resumed experiment's stored trials reached."""
    tracked = TrackedExperiment(None, None, settings.experiment)
    trials: list[Trial] = []
    warm = 0  # trials taken from ``start``
    if store is not None:
        doc = settings_of(scenario, settings)
        name = settings.experiment or _default_name(scenario, doc, strategy, evaluator, settings.seed)
        exp, _ = store.open_experiment(
            name, scenario=scenario.name, strategy=strategy, evaluator=evaluator, seed=settings.seed, settings=doc
        )
        tracked = TrackedExperiment(store, exp.id, name, clock)
        rows = store.trial_rows(exp.id)
        trials = [trial_from_row(r) for r in rows]
        if clock is not None:
            clock.resumed_s = max((r.elapsed_s or 0.0 for r in rows), default=0.0)
        warm = int(exp.settings.get("warm_start", 0)) if trials else 0  # a resumed warm start keeps its count
        tracked.set_status(ExperimentStatus.RUNNING, max_evals=settings.max_evals)
    if not trials and start:  # a warm start is recorded like the search's own trials, so a resume has it
        # numbered from 0 as this search's own trials; only evaluated ones count towards min_trials
        # (and as known ones: another search's steps say nothing of this one's schedule)
        trials = [replace(t, index=i, step=None) for i, t in enumerate(start)]
        warm = sum(t.evaluated for t in trials)
        # the count first: a resume after a crash in between overcounts, never forgets
        tracked.set_status(ExperimentStatus.RUNNING, warm_start=warm)
        for t in trials:
            tracked.add_trial(t)
    return Opened(tracked, trials, warm)


def _default_name(scenario: Scenario, doc: dict[str, Any], strategy: str, evaluator: str, seed: int) -> str:
    """The name of an experiment run without ``--experiment``: what it was run with, and a digest of it."""
    tag = hashlib.sha256(json.dumps([doc, strategy, evaluator, seed], sort_keys=True).encode()).hexdigest()
    return f"{scenario.name}-{strategy}-{evaluator}-s{seed}-{tag[:8]}"
