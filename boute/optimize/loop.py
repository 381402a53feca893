"""The search loop every strategy runs in: ask -> screen -> decode -> evaluate -> record, on equal budgets.

Strategies are *stateless over history*: ``ask(trials)`` proposes the point for trial ``len(trials)``
from the trials so far, deterministically for a given seed. That is what makes resuming exact: a resumed
run hands the stored trials back and the next ask is the one the interrupted run would have made.

With a :class:`~boute.optimize.screen.Screen`, a proposal's routing is first moved into the region where the
exact quality model meets the floor, and a plan that cannot carry its load (capacity bound) is recorded
as a screened trial (:attr:`TrialStatus.SCREENED`) without being evaluated: it costs no evaluation (``max_evals`` counts evaluated
trials), and the strategy sees it in the history, so it is never proposed again and resuming stays exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from boute.errors import BouteError
from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import EvalResult, Evaluator
from boute.optimize.evaluators.pool import EvaluatorPool
from boute.optimize.objectives import Objective
from boute.optimize.screen import Screen
from boute.optimize.settings import SearchSettings
from boute.optimize.space import Space
from boute.optimize.status import TrialStatus
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


def _trial(space: Space, index: int, x: np.ndarray, asked: np.ndarray | None, res: EvalResult | BouteError) -> Trial:
    cand = space.decode(x)
    xs = tuple(float(v) for v in np.clip(x if asked is None else asked, 0, 1))
    zs = tuple(float(v) for v in space.encode(cand))
    if isinstance(res, BouteError):
        return Trial(index, xs, zs, cand, None, status=TrialStatus.FAILED, error=str(res))
    return Trial(index, xs, zs, cand, res)


def _cached(hit: EvalResult) -> EvalResult:
    """``hit`` as the answer to a repeat of its plan: no wall time, marked ``cached``."""
    return replace(hit, wall_s=0.0, extra=replace(hit.extra, cached=True))


def evaluate_point(
    space: Space,
    evaluator: Evaluator,
    x: np.ndarray,
    index: int,
    cache: dict[str, EvalResult] | None = None,
    *,
    asked: np.ndarray | None = None,
) -> Trial:
    """Decode ``x`` and evaluate it; a plan already evaluated is not re-evaluated (``cache``).

    ``asked``: the point the strategy proposed, when the screen moved it to ``x`` (stored as the trial's x).
    """
    return evaluate_batch(space, EvaluatorPool(evaluator, space.scenario, 0, workers=1), [(x, asked)], index, cache)[0]


def evaluate_batch(
    space: Space,
    pool: EvaluatorPool,
    points: Sequence[tuple[np.ndarray, np.ndarray | None]],
    start: int,
    cache: dict[str, EvalResult] | None = None,
) -> list[Trial]:
    """Evaluate ``(x, asked)`` points as trials ``start, start + 1, ...``: cached plans are not re-evaluated,
    new ones go to ``pool`` together (in parallel where it has workers), results in the order given."""
    cands = [space.decode(x) for x, _ in points]
    todo = [i for i, c in enumerate(cands) if cache is None or c.key() not in cache]
    firsts: dict[str, int] = {}
    for i in todo:  # a plan asked twice in one batch is evaluated once
        firsts.setdefault(cands[i].key(), i)
    fresh = dict(zip(firsts.values(), pool.map([cands[i] for i in firsts.values()]), strict=True))
    out: list[Trial] = []
    for i, ((x, asked), cand) in enumerate(zip(points, cands, strict=True)):
        key = cand.key()
        if i in fresh:
            res: EvalResult | BouteError = fresh[i]
            if cache is not None and isinstance(res, EvalResult):
                cache[key] = res
        elif cache is not None and key in cache:
            res = _cached(cache[key])
        else:  # a repeat, within this batch, of a plan whose evaluation failed
            res = fresh[firsts[key]]
        out.append(_trial(space, start + i, x, asked, res))
    return out


@dataclass(frozen=True)
class LoopHooks:
    """What the loop reports to and runs on beside its settings; none of it changes what is proposed.

    ``on_trial``: each trial as it is recorded (screened ones too), before it counts; ``pool``: the
    evaluator's worker processes (default: one, in this process); ``deadline``: a ``time.monotonic()``
    instant after which no new batch is asked; ``clock``: where the time goes, by phase
    (:mod:`boute.optimize.clock`: propose, screen, evaluate, record).
    """

    on_trial: Callable[[Trial], None] | None = None
    pool: EvaluatorPool | None = None
    deadline: float | None = None
    clock: SearchClock = field(default_factory=SearchClock)


@dataclass
class _Progress:
    """The loop's state: the trials so far and what is derived from them (resuming rebuilds it exactly)."""

    done: list[Trial]
    cache: dict[str, EvalResult]  # plans evaluated so far, by key: a repeat is answered from here
    tracker: ChoiceTracker  # the chosen plan after each evaluation (convergence)
    evaluated: int  # trials that cost an evaluation
    screened_run: int = 0  # proposals screened out in a row

    @classmethod
    def resume(cls, trials: Sequence[Trial], targets: Targets, objective: Objective) -> _Progress:
        done = list(trials)
        cache = {t.candidate.key(): t.result for t in done if t.ok and t.result is not None}
        tracker = ChoiceTracker(targets, objective)
        for t in done:
            tracker.add(t)
        return cls(done, cache, tracker, sum(t.evaluated for t in done))

    def record(self, trial: Trial, hooks: LoopHooks) -> None:
        if hooks.on_trial is not None:
            with hooks.clock.timing("record"):
                hooks.on_trial(trial)  # persisted before it counts: a crash after this line loses nothing
        self.done.append(trial)
        if trial.evaluated:
            self.tracker.add(trial)
            self.evaluated += 1
            self.screened_run = 0
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
    has not changed for ``settings.patience`` evaluations (never before ``min_trials`` trials), or
    ``hooks.deadline`` passed; ``trials`` resumes a run.

    ``screen``: project and screen every proposal first (module doc); screened trials are recorded (and
    passed to ``hooks.on_trial``) but not evaluated and not counted in ``max_evals``, ``patience`` or
    ``min_trials``. ``settings.batch``: proposals asked at once (:meth:`Strategy.ask_batch`) and evaluated
    together, by ``hooks.pool``'s workers when it has them; a batch never runs past ``max_evals``. The
    deadline is checked between batches, so a search overruns it by at most one batch. The other settings
    (the evaluator's and strategy's names, workers, ...) are the caller's to apply.
    """
    hooks = hooks if hooks is not None else LoopHooks()
    clock = hooks.clock
    strategy.bind(evaluator)  # e.g. MOBO takes the evaluator's exact quality function
    strategy.use_clock(clock)  # e.g. MOBO splits its proposals' time into fit, pool and acquisition
    if screen is not None:
        strategy.use_screen(screen)  # e.g. MOBO screens its acquisition pool too
    runner = hooks.pool if hooks.pool is not None else EvaluatorPool(evaluator, space.scenario, 0, workers=1)
    targets = targets_of(space)
    state = _Progress.resume(trials, targets, settings.chosen_by)
    while state.evaluated < settings.max_evals and not converged(state.tracker, targets, settings.patience, min_trials):
        if hooks.deadline is not None and time.monotonic() >= hooks.deadline:
            break
        with clock.timing("propose"):
            xs = [
                np.asarray(x, dtype=float).reshape(-1) for x in strategy.ask_batch(state.done, max(1, settings.batch))
            ]
        xs = xs[: max(1, min(len(xs), settings.max_evals - state.evaluated))]
        slots, points = _screened(space, screen, xs, len(state.done), clock)
        with clock.timing("evaluate"):
            results = iter(evaluate_batch(space, runner, points, 0, state.cache))
        for index, slot in enumerate(slots, start=len(state.done)):
            if slot is None:  # evaluated: numbered in its place among the batch's screened trials
                t = next(results)
                slot = Trial(index, t.x, t.z, t.candidate, t.result, t.status, t.error)
            state.record(slot, hooks)
        if state.screened_run >= SCREENED_RUN_LIMIT:
            break
    return state.done


def _screened(
    space: Space, screen: Screen | None, xs: Sequence[np.ndarray], start: int, clock: SearchClock
) -> tuple[list[Trial | None], list[tuple[np.ndarray, np.ndarray | None]]]:
    """The batch ``xs`` (trials ``start, start + 1, ...``) through the screens: per proposal its screened
    trial, or None where an evaluation goes; and the points to evaluate, ``(x projected, x asked)``."""
    slots: list[Trial | None] = []
    points: list[tuple[np.ndarray, np.ndarray | None]] = []
    for j, x in enumerate(xs):
        if screen is None:
            points.append((x, None))
            slots.append(None)
            continue
        with clock.timing("screen"):
            xp, cand, why = screen.admit(x)
        if why is None:
            points.append((xp, x))
            slots.append(None)
        else:
            z = tuple(float(v) for v in space.encode(cand))
            asked = tuple(float(v) for v in np.clip(x, 0, 1))
            slots.append(Trial(start + j, asked, z, cand, None, TrialStatus.SCREENED, why))
    return slots, points
