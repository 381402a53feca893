"""Proposing while evaluating (boute/optimize/loop.py, batches.py, pace.py): the schedule's trials do not depend
on whether evaluation overlaps, the stops (max_evals, patience, time budget) hold with a batch in flight, a
resume loses and repeats nothing, and the first plan meeting the targets is timed.

Real parts: the real loop, space, strategies, screens, worker processes (the fast evaluator in a pool of two);
the synthetic evaluator stands in where a test needs to count or time evaluations. The time budget is tested
on a fake clock advanced by each evaluation and proposal, so its assertions are exact, not wall-clock guesses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import EvalResult
from boute.optimize.evaluators.fast import FastEvaluator
from boute.optimize.evaluators.pool import EvaluatorPool, Submitted
from boute.optimize.loop import LoopHooks, run_search
from boute.optimize.pace import Pace
from boute.optimize.screen import Screen
from boute.optimize.settings import SearchSettings
from boute.optimize.space import Candidate, Space
from boute.optimize.status import TrialStatus
from boute.optimize.strategies.base import Strategy
from boute.optimize.strategies.factory import make_strategy
from boute.optimize.trials import Trial
from boute.specs import Scenario, load_scenario
from tests.optimize_synthetic import SyntheticEvaluator


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return load_scenario(None)


def _key(t: Trial) -> tuple[Any, ...]:
    """What a trial is, for comparing two searches: its number, step, point, plan, status and figures."""
    r = t.result
    figures = None if r is None else (r.quality, r.p95_latency_s, r.cost_per_hour, r.extra.cached)
    return (t.index, t.step, t.x, t.z, t.candidate.key(), t.status, t.error, figures)


class _Logged(Strategy):
    """A strategy that logs each proposal (with how many of the trials it saw were pending), then asks ``inner``."""

    def __init__(self, inner: Strategy, log: list[tuple[str, int]], advance: Any = None) -> None:
        self.inner, self.log, self.advance = inner, log, advance
        self.n_init = inner.n_init

    def ask_batch(self, trials: Sequence[Trial], q: int) -> list[np.ndarray]:
        self.log.append(("ask", sum(t.status == TrialStatus.PENDING for t in trials)))
        if self.advance is not None:
            self.advance()
        return self.inner.ask_batch(trials, q)

    def ask(self, trials: Sequence[Trial]) -> np.ndarray:
        return self.inner.ask(trials)

    def bind(self, evaluator: Any) -> None:
        self.inner.bind(evaluator)

    def use_screen(self, screen: Screen) -> None:
        self.inner.use_screen(screen)

    def use_clock(self, clock: SearchClock) -> None:
        self.inner.use_clock(clock)


class _LoggedSubmitted(Submitted):
    def __init__(self, inner: Submitted, log: list[tuple[str, int]], k: int) -> None:
        self.inner, self.log, self.k = inner, log, k

    @property  # type: ignore[override]
    def ready_at(self) -> float | None:
        return self.inner.ready_at

    def results(self) -> list[Any]:
        self.log.append(("results", self.k))
        return self.inner.results()


class _LoggedPool(EvaluatorPool):
    """The real pool of worker processes, logging each hand-over and each wait for a batch's results."""

    def __init__(self, log: list[tuple[str, int]], *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.log, self.batches = log, 0

    def submit(self, cands: Sequence[Candidate]) -> Submitted:
        k = self.batches
        self.batches += 1
        self.log.append(("submit", k))
        return _LoggedSubmitted(super().submit(cands), self.log, k)


@pytest.mark.timeout(180)  # two worker processes start
def test_the_same_trials_in_order_whether_or_not_evaluation_overlaps(scenario: Scenario) -> None:
    """MOBO proposes step k+1 while two worker processes evaluate step k (each proposal is made after its
    batch was handed over and before its results are asked for), and the trials are exactly those of the same
    schedule run one step after the other in this process: the schedule, not the timing, decides them."""
    space = Space.build(scenario)
    ev = FastEvaluator(scenario)

    def search(overlap: bool, pool: EvaluatorPool | None, log: list[tuple[str, int]]) -> list[Trial]:
        return run_search(
            space,
            ev,
            _Logged(make_strategy("mobo", space, 3), log),
            SearchSettings(max_evals=28, batch=4, patience=None, overlap=overlap, pipeline=True, seed=3),
            screen=Screen.build(space, ev.quality_model, ev.mode, ev.workload),
            hooks=LoopHooks(pool=pool),
        )

    log: list[tuple[str, int]] = []
    with _LoggedPool(log, ev, scenario, 3, workers=2) as pool:
        overlapped = search(True, pool, log)
    serial = search(False, None, [])
    assert [_key(t) for t in overlapped] == [_key(t) for t in serial]
    assert sum(t.evaluated for t in overlapped) == 28
    assert sum(t.status == TrialStatus.SCREENED for t in overlapped) > 0  # the screens' trials keep their places
    # every batch but the last: handed over, then the next proposal (seeing it pending), then its results
    assert log[0][0] == "ask"  # the first batch's proposal, with nothing in flight
    events = log[1:]
    batches = pool.batches
    assert batches >= 7
    for k in range(batches - 1):
        at = events.index(("submit", k))
        assert events[at + 1][0] == "ask" and events[at + 2] == ("results", k), events[at : at + 3]


def _evaluator(scenario: Scenario) -> SyntheticEvaluator:
    return SyntheticEvaluator(scenario)


def test_a_patience_stop_drops_the_batch_proposed_beside_the_last_one(scenario: Scenario) -> None:
    """The batch proposed while the last one was evaluated is neither evaluated nor recorded when that last
    one ends the search (patience); max_evals is never passed by the batch in flight."""
    space = Space.build(scenario)
    ev = _evaluator(scenario)
    log: list[tuple[str, int]] = []
    settings = SearchSettings(max_evals=400, batch=4, patience=6, seed=1, overlap=True)
    trials = run_search(space, ev, _Logged(make_strategy("random", space, 1), log), settings)
    evaluated = sum(t.evaluated for t in trials)
    assert evaluated < 400  # stopped by patience
    assert ev.calls == sum(t.ok and not t.checked_result.extra.cached for t in trials)  # nothing unrecorded
    steps = max(t.step for t in trials) + 1
    assert len(log) == steps + 1  # one proposal more than the steps recorded: the speculative one, dropped
    assert [t.index for t in trials] == list(range(len(trials)))

    ev2 = _evaluator(scenario)
    capped = run_search(space, ev2, make_strategy("random", space, 1), replace(settings, max_evals=10, patience=None))
    assert sum(t.evaluated for t in capped) == 10 and ev2.calls <= 10  # 4 + 4 + the 2 left, never 12


def test_a_resume_from_a_batch_recorded_in_part_loses_and_repeats_nothing(scenario: Scenario) -> None:
    """A search stored up to a step's end resumes to exactly the uninterrupted search's trials (TPE: its asks are
    a function of the trials, the pending ones included); one killed between two trials of a batch keeps every
    stored trial and evaluates no plan twice."""
    space = Space.build(scenario)
    settings = SearchSettings(max_evals=40, batch=4, patience=None, seed=2, overlap=True)

    def search(max_evals: int, start: Sequence[Trial] = (), ev: SyntheticEvaluator | None = None) -> list[Trial]:
        ev = ev or _evaluator(scenario)
        return run_search(
            space, ev, make_strategy("tpe", space, 2), replace(settings, max_evals=max_evals), trials=list(start)
        )

    full = search(40)
    part = search(16)
    assert [_key(t) for t in search(40, part)] == [_key(t) for t in full]
    # killed in the middle of recording step 5 (its first two trials stored)
    cut = [t for t in full if t.step is not None and t.step < 5] + [t for t in full if t.step == 5][:2]
    ev = _evaluator(scenario)
    resumed = search(40, cut, ev)
    assert [_key(t) for t in resumed[: len(cut)]] == [_key(t) for t in cut]  # none lost
    assert [t.index for t in resumed] == list(range(len(resumed)))
    assert sum(t.evaluated for t in resumed) == 40
    fresh = [t for t in resumed[len(cut) :] if t.evaluated]
    assert ev.calls == sum(not t.checked_result.extra.cached for t in fresh)  # only new trials were evaluated
    stored = {t.candidate.key() for t in cut if t.evaluated}
    assert all(t.checked_result.extra.cached for t in fresh if t.candidate.key() in stored)  # none evaluated again


class _FakeTime:
    """Seconds on a clock that moves only when told: each evaluation and each proposal advance it."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


class _TimedEvaluator(SyntheticEvaluator):
    """The synthetic evaluator, each evaluation taking ``cost(i)`` seconds of the fake clock (``i``: its number)."""

    def __init__(self, scenario: Scenario, clock: _FakeTime, cost: Any) -> None:
        super().__init__(scenario)
        self.clock, self.cost = clock, cost

    def __call__(self, cand: Candidate) -> EvalResult:
        self.clock.t += self.cost(self.calls)
        return super().__call__(cand)


@pytest.mark.parametrize(
    ("cost", "budget"),
    [(lambda i: 0.25, 9.1), (lambda i: 0.25 if (i // 4) % 2 == 0 else 0.6, 14.0)],
    ids=["even steps", "uneven steps"],
)
def test_the_time_budget_holds_when_a_step_makes_it_tight(scenario: Scenario, cost: Any, budget: float) -> None:
    """Steps of 1.5 s (four 0.25 s evaluations and a 0.5 s proposal) against 9.1 s: checking the clock between
    steps would start a seventh step at 9.0 s and end at 10.5 s (15% over); the forecast stops at 9.0 s. With
    steps of 1.5 s and 2.9 s in turn, the forecast's maximum over the last steps keeps every one in budget. The
    search ends within its budget, and less than one step before it."""
    space = Space.build(scenario)
    clock = _FakeTime()
    ev = _TimedEvaluator(scenario, clock, cost)

    def propose() -> None:
        clock.t += 0.5

    pace = Pace()
    log: list[tuple[str, int]] = []
    trials = run_search(
        space,
        ev,
        _Logged(make_strategy("random", space, 0), log, advance=propose),
        SearchSettings(max_evals=10_000, batch=4, patience=None),
        hooks=LoopHooks(deadline=budget, now=clock.now, pace=pace),
    )
    end = clock.t
    longest = max(pace.walls)
    assert end <= budget, (end, pace.decisions)
    assert end > budget - longest - 1e-9
    assert pace.decisions[-1][2] is False and all(ok for _, _, ok in pace.decisions[:-1])
    assert all(forecast <= budget for _, forecast, ok in pace.decisions if ok)
    assert sum(t.evaluated for t in trials) == ev.calls


def test_pace_forecasts_a_step_and_the_wait_for_its_batch() -> None:
    """A step started now commits to its own duration and to the evaluation left after it hands its batch over."""
    pace = Pace()
    assert pace.fits(5.0, 5.0) and pace.fits(1.0, None)
    for w in (1.0, 3.0, 2.0, 1.5):
        pace.step_took(w)
    pace.tail_took(0.5)
    assert pace.forecast(10.0) == pytest.approx(10.0 + 3.0 + 0.5)  # the largest of the last three steps
    pace.step_took(1.0)  # 3.0 s is now four steps back
    assert pace.forecast(10.0) == pytest.approx(10.0 + 2.0 + 0.5)
    assert not pace.fits(10.0, 12.4) and pace.fits(10.0, 12.5)


def test_the_first_plan_meeting_the_targets_is_marked_once_with_its_evaluations(scenario: Scenario) -> None:
    space = Space.build(scenario)
    ev = _evaluator(scenario)
    clock = SearchClock()
    trials = run_search(
        space,
        ev,
        make_strategy("random", space, 4),
        SearchSettings(max_evals=60, batch=4, patience=None),
        hooks=LoopHooks(clock=clock),
    )
    goal = space.scenario.goal
    evaluated = [t for t in trials if t.evaluated]
    first = next(
        i
        for i, t in enumerate(evaluated)
        if t.ok and goal.met_by(t.checked_result.quality, t.checked_result.p95_latency_s, t.candidate.cost_per_hour)
    )
    mark = clock.marks["first_feasible"]
    assert mark.evaluations == first + 1 and mark.seconds > 0
    resumed_clock = SearchClock()  # a search resumed with such a plan already found marks nothing
    run_search(
        space,
        ev,
        make_strategy("random", space, 4),
        SearchSettings(max_evals=64, batch=4, patience=None),
        trials=trials,
        hooks=LoopHooks(clock=resumed_clock),
    )
    assert "first_feasible" not in resumed_clock.marks


def test_mobo_searches_around_the_first_pick_in_flight_as_around_the_incumbent(scenario: Scenario) -> None:
    """With a batch in flight, every single change of its first pick (the plan the last acquisition ranked
    highest) is in MOBO's pool, as every single change of the incumbent is: a chain of improvements does not
    wait a step for each result (docs/optimizer.md)."""
    from boute.optimize.acquisition.pool import axis_neighbours

    space = Space.build(scenario)
    ev = _evaluator(scenario)
    done = run_search(
        space, ev, make_strategy("random", space, 5), SearchSettings(max_evals=16, batch=4, patience=None)
    )
    flying = [
        t.pending() for t in run_search(space, ev, make_strategy("random", space, 6), SearchSettings(max_evals=4))
    ]
    history = [*done, *(replace(t, index=len(done) + i) for i, t in enumerate(flying))]
    seen = {t.candidate.key() for t in history}
    around = {space.decode(x).key() for x in axis_neighbours(space, np.asarray(flying[0].z))} - seen

    def pool_keys(look_ahead: bool) -> set[str]:
        mobo = make_strategy("mobo", space, 0, look_ahead=look_ahead, n_init=4)
        mobo.bind(ev)
        pool, _ = mobo._bo_step(history, [t for t in history if t.ok])
        assert pool is not None
        return {c.key() for c in pool.candidates}

    assert around and around <= pool_keys(True)
    assert not around <= pool_keys(False)
