"""The search loop every strategy runs in: ask -> screen -> decode -> evaluate -> record, on equal budgets.

Strategies are *stateless over history*: ``ask(trials)`` proposes the point for trial ``len(trials)``
from the trials so far, deterministically for a given seed. That is what makes resuming exact: a resumed
run hands the stored trials back and the next ask is the one the interrupted run would have made.

With a :class:`~boute.optimize.screen.Screen`, a proposal's routing is first moved into the region where the
exact quality model meets the floor, and a plan that cannot carry its load (capacity bound) is recorded
as a ``screened`` trial without being evaluated: it costs no evaluation (``max_evals`` counts evaluated
trials), and the strategy sees it in the history, so it is never proposed again and resuming stays exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from boute.errors import BouteError
from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import EvalResult, Evaluator
from boute.optimize.evaluators.pool import EvaluatorPool
from boute.optimize.objectives import Objective
from boute.optimize.screen import Screen
from boute.optimize.space import Space
from boute.optimize.strategies.base import Strategy
from boute.optimize.trials import SCREENED, ChoiceTracker, Trial
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
        return Trial(index, xs, zs, cand, None, status="failed", error=str(res))
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


def run_search(
    space: Space,
    evaluator: Evaluator,
    strategy: Strategy,
    *,
    max_evals: int,
    trials: Sequence[Trial] = (),
    patience: int | None = None,
    min_trials: int = 0,
    on_trial: Callable[[Trial], None] | None = None,
    objective: Objective | None = None,
    screen: Screen | None = None,
    batch: int = 1,
    pool: EvaluatorPool | None = None,
    deadline: float | None = None,
    clock: SearchClock | None = None,
) -> list[Trial]:
    """Run until ``max_evals`` trials were evaluated, the chosen plan converged or ``deadline`` (a
    ``time.monotonic()`` instant) passed; ``trials`` resumes a run.

    ``screen``: project and screen every proposal first (module doc); screened trials are recorded (and
    passed to ``on_trial``) but not evaluated and not counted in ``max_evals``, ``patience`` or ``min_trials``.
    ``batch``: proposals asked at once (:meth:`Strategy.ask_batch`) and evaluated together, by ``pool``'s
    workers when it has them; a batch never runs past ``max_evals``. The deadline is checked between
    batches, so a search overruns it by at most one batch. ``clock``: where the time goes, by phase
    (:mod:`boute.optimize.clock`: propose, screen, evaluate, record).
    """
    done = list(trials)
    clock = clock if clock is not None else SearchClock()
    strategy.bind(evaluator)  # e.g. MOBO takes the evaluator's exact quality function
    strategy.use_clock(clock)  # e.g. MOBO splits its proposals' time into fit, pool and acquisition
    if screen is not None:
        strategy.use_screen(screen)  # e.g. MOBO screens its acquisition pool too
    runner = pool if pool is not None else EvaluatorPool(evaluator, space.scenario, 0, workers=1)
    cache = {t.candidate.key(): t.result for t in done if t.ok and t.result is not None}
    targets = targets_of(space)
    tracker = ChoiceTracker(targets, objective)
    for t in done:
        tracker.add(t)
    evaluated = sum(t.evaluated for t in done)
    run = 0

    def record(trial: Trial) -> None:
        if on_trial is not None:
            with clock.timing("record"):
                on_trial(trial)  # persisted before it counts: a crash after this line loses nothing
        done.append(trial)

    while evaluated < max_evals and not converged(tracker, targets, patience, min_trials):
        if deadline is not None and time.monotonic() >= deadline:
            break
        with clock.timing("propose"):
            xs = [np.asarray(x, dtype=float).reshape(-1) for x in strategy.ask_batch(done, max(1, batch))]
        xs = xs[: max(1, min(len(xs), max_evals - evaluated))]
        points: list[tuple[np.ndarray, np.ndarray | None]] = []
        slots: list[Trial | None] = []  # screened trials in place, None where an evaluation goes
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
                xs_ = tuple(float(v) for v in np.clip(x, 0, 1))
                slots.append(Trial(len(done) + j, xs_, z, cand, None, SCREENED, why))
        indices = [len(done) + j for j, s in enumerate(slots) if s is None]
        with clock.timing("evaluate"):
            results = iter(evaluate_batch(space, runner, points, 0, cache))
        for slot in slots:
            if slot is not None:
                record(slot)
                run += 1
                continue
            t = next(results)
            record(Trial(indices.pop(0), t.x, t.z, t.candidate, t.result, t.status, t.error))
            tracker.add(done[-1])
            evaluated += 1
            run = 0
        if run >= SCREENED_RUN_LIMIT:
            break
    return done
