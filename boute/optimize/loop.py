"""The search loop every strategy runs in: propose -> screen -> evaluate -> record, on equal budgets, with
the next batch proposed while this one is evaluated.

Strategies are *stateless over history*: ``ask_batch(trials, q)`` proposes the points for trials
``len(trials), len(trials) + 1, ...`` from the trials so far, deterministically for a given seed.

**The schedule** (``settings.pipeline``, the default where evaluations run in worker processes): the batch of
step k+1 is proposed with exactly step k's batch *pending*, in the history as trials whose results are unknown
(:attr:`TrialStatus.PENDING`; its screened trials as they are), and the results of the steps before it. It can
then be proposed *while* step k is evaluated (``settings.overlap``): the strategy's model fits and scores
while the workers simulate, instead of each waiting on the other (asynchronous batch BO; MOBO hands the
pending points to its acquisition as BoTorch's ``X_pending``). The schedule fixes what each proposal sees,
not when it is made, so a fixed seed gives the same trials in the same order whether or not evaluation
overlaps (``overlap=False`` runs the same schedule one step after the other) and with any number of workers.
Without ``pipeline`` step k+1 sees step k's results, and nothing overlaps. A strategy that cannot propose
until the pending results are in (NSGA-II at the end of a generation) proposes nothing; the loop then waits
for them and asks again with nothing pending.

**Stopping.** ``max_evals`` counts evaluations, those in flight included: a proposal is cut to what is left,
so no batch runs past it. Patience (the chosen plan unchanged for ``patience`` evaluations, never before
``min_trials``) is judged as each batch is recorded; a batch proposed meanwhile is then dropped: never
evaluated, never recorded, so a resumed search that asks for more proposes it again. The time budget
(``hooks.deadline``): a step starts only if it is forecast to end by then (:mod:`boute.optimize.pace`).

**Resuming.** Each trial carries its step (``Trial.step``); a resumed search takes its last stored step as
the pending batch (:meth:`Batch.stored`), so its first proposal is the one the interrupted search made after
that step: every stored trial is kept, none is evaluated again. A batch is recorded trial by trial, each
committed before it counts; a search killed between two of them resumes with the part recorded as its
pending batch (the rest of that batch is not proposed again).

**Screens** (:mod:`boute.optimize.batches`): with a :class:`~boute.optimize.screen.Screen`, a proposal's
routing is first moved into the region where the exact quality model meets the floor, and a plan that
cannot carry its load (capacity bound) is recorded as a screened trial (:attr:`TrialStatus.SCREENED`)
without being evaluated: it costs no evaluation, and the strategy sees it in the history, so it is never
proposed again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from boute.optimize.batches import Batch
from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import EvalResult, Evaluator
from boute.optimize.evaluators.pool import EvaluatorPool
from boute.optimize.objectives import Objective
from boute.optimize.pace import Pace
from boute.optimize.screen import Screen
from boute.optimize.settings import SearchSettings
from boute.optimize.space import Space
from boute.optimize.strategies.base import Strategy
from boute.optimize.trials import ChoiceTracker, Trial
from boute.specs.targets import Targets

#: a strategy whose proposals the screens reject this many times in a row has nothing new left to offer
#: (e.g. random search in a space almost all of which is overloaded): the search stops there
SCREENED_RUN_LIMIT = 1000


def targets_of(space: Space) -> Targets:
    """The targets a search in ``space`` must meet (the scenario's goal: floor, cap, budget)."""
    return space.scenario.goal


def converged(
    trials: Sequence[Trial] | ChoiceTracker,
    targets: Targets,
    patience: int | None,
    min_trials: int = 0,
    objective: Objective | None = None,
) -> bool:
    """True when the chosen plan has not changed over the last ``patience`` evaluations (and one exists)."""
    if patience is None:
        return False
    if isinstance(trials, ChoiceTracker):
        keys = trials.keys
    else:
        tracker = ChoiceTracker(targets, objective)
        for t in trials:
            tracker.add(t)
        keys = tracker.keys
    if len(keys) < max(min_trials, patience + 1):
        return False
    last = keys[-1]
    return last is not None and all(k == last for k in keys[-(patience + 1) :])


@dataclass(frozen=True)
class LoopHooks:
    """What the loop reports to and runs on beside its settings; none of it changes what is proposed.

    ``on_trial``: each trial as it is recorded (screened ones too), before it counts; ``pool``: the
    evaluator's worker processes (default: one, in this process); ``deadline``: an instant of ``now`` by
    which the search ends (no step starts that is forecast to end later, :mod:`boute.optimize.pace`);
    ``clock``: where the time goes, by phase (:mod:`boute.optimize.clock`: propose, screen, evaluate,
    record), and when the first plan meeting the targets came; ``now``: the time the deadline and the steps'
    durations are read on; ``pace``: the steps' durations and the decisions taken on them (a test reads them).
    """

    on_trial: Callable[[Trial], None] | None = None
    pool: EvaluatorPool | None = None
    deadline: float | None = None
    clock: SearchClock = field(default_factory=SearchClock)
    now: Callable[[], float] = time.monotonic
    pace: Pace = field(default_factory=Pace)


@dataclass
class _Progress:
    """The loop's state: the trials so far and what is derived from them (resuming rebuilds it exactly)."""

    done: list[Trial]
    cache: dict[str, EvalResult]  # plans evaluated so far, by key: a repeat is answered from here
    tracker: ChoiceTracker  # the chosen plan after each evaluation (convergence)
    evaluated: int  # trials that cost an evaluation
    screened_run: int = 0  # proposals screened out in a row
    feasible: bool = False  # some evaluated plan meets the targets

    @classmethod
    def resume(cls, trials: Sequence[Trial], targets: Targets, objective: Objective) -> _Progress:
        done = list(trials)
        cache = {t.candidate.key(): t.result for t in done if t.ok and t.result is not None}
        tracker = ChoiceTracker(targets, objective)
        for t in done:
            tracker.add(t)
        feasible = any(k is not None for k in tracker.keys)
        return cls(done, cache, tracker, sum(t.evaluated for t in done), feasible=feasible)

    def record(self, trial: Trial, hooks: LoopHooks) -> None:
        if hooks.on_trial is not None:
            with hooks.clock.timing("record"):
                hooks.on_trial(trial)  # persisted before it counts: a crash after this line loses nothing
        self.done.append(trial)
        if trial.evaluated:
            self.tracker.add(trial)
            self.evaluated += 1
            self.screened_run = 0
            if not self.feasible and self.tracker.keys[-1] is not None:
                self.feasible = True
                hooks.clock.mark("first_feasible", self.evaluated)
        else:
            self.screened_run += 1


def run_search(
    space: Space,
    evaluator: Evaluator,
    strategy: Strategy,
    settings: SearchSettings,
    *,
    trials: Sequence[Trial] = (),
    min_trials: int = 0,
    screen: Screen | None = None,
    hooks: LoopHooks | None = None,
) -> list[Trial]:
    """Run until ``settings.max_evals`` trials were evaluated, the chosen plan (by ``settings.objective``)
    has not changed for ``settings.patience`` evaluations (never before ``min_trials`` trials), the next step
    would end past ``hooks.deadline``, or the strategy has nothing left to propose; ``trials`` resumes a run.

    ``screen``: project and screen every proposal first (module doc); screened trials are recorded (and
    passed to ``hooks.on_trial``) but not evaluated and not counted in ``max_evals``, ``patience`` or
    ``min_trials``. ``settings.batch``: proposals asked at once (:meth:`Strategy.ask_batch`) and evaluated
    together, by ``hooks.pool``'s workers when it has them; ``settings.pipeline`` / ``settings.overlap``: the
    schedule (module doc). The other settings (the evaluator's and strategy's names, workers, ...) are the
    caller's to apply.
    """
    hooks = hooks if hooks is not None else LoopHooks()
    strategy.bind(evaluator)  # e.g. MOBO takes the evaluator's exact quality function
    strategy.use_clock(hooks.clock)  # e.g. MOBO splits its proposals' time into fit, pool and acquisition
    if screen is not None:
        strategy.use_screen(screen)  # e.g. MOBO screens its acquisition pool too
    runner = hooks.pool if hooks.pool is not None else EvaluatorPool(evaluator, space.scenario, 0, workers=1)
    run = _Run(space, strategy, settings, screen, runner, hooks, min_trials)
    state = _Progress.resume(trials, targets_of(space), settings.chosen_by)
    batch = Batch.stored(state.done) if settings.pipeline else None  # the step pending when it was stored
    step = max((t.step for t in state.done if t.step is not None), default=-1) + 1
    early = bool(settings.pipeline and settings.overlap)  # propose while the batch in flight is evaluated
    while True:
        if early:
            xs = run.propose(state, batch)
            run.record(state, batch)
        else:
            run.record(state, batch)
            xs = run.propose(state, batch)
        if xs is None or run.stopped(state):  # not asked (module doc: stopping), or a patience stop
            break
        if not xs:  # nothing until the pending batch's results are in: ask again with them
            if batch is None or not settings.pipeline:
                break
            batch = None
            continue
        batch = Batch.screened(space, screen, xs, step, len(state.done), hooks.clock)
        with hooks.clock.timing("evaluate"):  # (evaluations in this process happen here)
            batch.submit(runner, state.cache)
        step += 1
        hooks.pace.step_took(hooks.now() - run.decided_at)
    return state.done


@dataclass
class _Run:
    """What the loop's steps run with (:func:`run_search`)."""

    space: Space
    strategy: Strategy
    settings: SearchSettings
    screen: Screen | None
    runner: EvaluatorPool
    hooks: LoopHooks
    min_trials: int
    decided_at: float = 0.0  # when the current step was decided (its duration counts from there)

    def stopped(self, state: _Progress) -> bool:
        """Converged (patience) or out of new proposals (the screens rejected the last many)."""
        s = self.settings
        targets = targets_of(self.space)
        return (
            converged(state.tracker, targets, s.patience, self.min_trials) or state.screened_run >= SCREENED_RUN_LIMIT
        )

    def propose(self, state: _Progress, batch: Batch | None) -> list[np.ndarray] | None:
        """The next batch's points, cut to the evaluations left; None when no step may start (module doc)."""
        hooks, s = self.hooks, self.settings
        self.decided_at = hooks.now()
        flying = batch.evaluations if batch is not None and not batch.recorded else 0
        room = s.max_evals - state.evaluated - flying
        if room <= 0 or self.stopped(state) or not hooks.pace.fits(self.decided_at, hooks.deadline):
            return None
        history = state.done
        if s.pipeline and batch is not None:  # the steps before it, with it pending
            history = [*state.done[: batch.start], *batch.pending]
        with hooks.clock.timing("propose"):
            xs = [np.asarray(x, dtype=float).reshape(-1) for x in self.strategy.ask_batch(history, max(1, s.batch))]
        return xs[:room]

    def record(self, state: _Progress, batch: Batch | None) -> None:
        """Wait for ``batch``'s evaluations (what ran beside the proposal is the clock's ``beside``) and record
        its trials in order; nothing for a batch recorded already."""
        if batch is None or batch.recorded:
            return
        clock = self.hooks.clock
        t0 = time.perf_counter()
        with clock.timing("evaluate"):
            trials = batch.collect(state.cache)
        waited = time.perf_counter() - t0
        if batch.ready_at is not None:
            clock.add_beside("evaluate", batch.ready_at - batch.handed_at - waited)
        self.hooks.pace.tail_took(batch.tail_s())
        for t in trials:
            state.record(t, self.hooks)
        batch.recorded = True
