"""``optimize(start=...)``: a search warm-started from a related search's trials, recorded and resumed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from boute.optimize.session import SearchRuntime, optimize
from boute.optimize.settings import SearchSettings
from boute.optimize.trials import Trial
from boute.specs import Scenario, load_scenario
from boute.tracking import open_store
from tests.optimize_synthetic import SyntheticEvaluator


@pytest.fixture
def store(tmp_path) -> Any:
    s = open_store(f"sqlite:///{tmp_path / 'track.db'}")
    yield s
    s.close()


@pytest.fixture(scope="module")
def first() -> tuple[Scenario, list[Trial]]:
    """A finished random search whose trials warm-start the searches below."""
    sc = load_scenario(None)
    return sc, optimize(
        sc,
        SearchSettings(strategy="random", max_evals=12, patience=None, batch=1, workers=1),
        SearchRuntime(evaluator=SyntheticEvaluator(sc)),
    ).trials


def _search(sc: Scenario, ev: SyntheticEvaluator, store: Any, name: str, max_evals: int, start: Sequence[Trial] = ()):
    """The warm or resumed search of these tests: random, patience 1, recorded as experiment ``name``."""
    return optimize(
        sc,
        SearchSettings(strategy="random", max_evals=max_evals, patience=1, experiment=name, seed=1, batch=1, workers=1),
        SearchRuntime(evaluator=ev, store=store, start=start),
    )


def test_a_warm_start_is_evaluated_once_recorded_and_never_the_whole_search(first, store) -> None:
    """The trials of a related search are not re-evaluated, count towards ``max_evals``, go into the store
    (so a resume has them), and the search still evaluates plans of its own even when the warm trials alone
    would satisfy ``patience``."""
    sc, trials = first
    ev = SyntheticEvaluator(sc)
    warm = _search(sc, ev, store, "w", len(trials) + 4, start=trials)
    # the same trials, taken as known ones: another search's steps say nothing of this one's schedule
    assert warm.resumed_trials == len(trials) and warm.trials[: len(trials)] == [replace(t, step=None) for t in trials]
    assert ev.calls >= 1 and len(warm.trials) > len(trials)  # patience 1 did not end it at the start
    assert [r.index for r in store.trial_rows(warm.experiment_id)] == list(range(len(warm.trials)))


def test_a_resumed_warm_start_still_waits_for_an_evaluation_of_its_own(first, store) -> None:
    """A warm start interrupted before any evaluation of its own: its resume remembers the warm count, so
    patience still waits for an evaluation of the resumed search's own."""
    sc, trials = first
    warm_only = _search(sc, SyntheticEvaluator(sc), store, "w2", sum(t.evaluated for t in trials), start=trials)
    assert len(warm_only.trials) == len(trials)
    ev = SyntheticEvaluator(sc)
    resumed = _search(sc, ev, store, "w2", len(trials) + 4)
    assert resumed.resumed_trials == len(trials) and ev.calls >= 1
