"""The search harness every strategy runs in: ask -> screen -> decode -> evaluate -> record, on equal budgets.

Strategies are *stateless over history*: ``ask(trials)`` proposes the point for trial ``len(trials)``
from the trials so far, deterministically for a given seed. That is what makes resuming exact: a resumed
run hands the stored trials back and the next ask is the one the interrupted run would have made.

With a :class:`~boute.optimize.screen.Screen`, a proposal's routing is first moved into the region where the
exact quality model meets the floor, and a plan that cannot carry its load (capacity bound) is recorded
as a ``screened`` trial without being evaluated: it costs no evaluation (``max_evals`` counts evaluated
trials), and the strategy sees it in the history, so it is never proposed again and resuming stays exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from boute.errors import BouteError
from boute.optimize.evaluators import EvalResult, Evaluator
from boute.optimize.objectives import Objective
from boute.optimize.result import SCREENED, ChoiceTracker, Trial
from boute.optimize.screen import Screen
from boute.optimize.space import Space
from boute.specs.targets import Targets

#: a strategy whose proposals the screens reject this many times in a row has nothing new left to offer
#: (e.g. random search in a space almost all of which is overloaded): the search stops there
SCREENED_RUN_LIMIT = 1000


class Strategy(Protocol):
    name: str

    def ask(self, trials: Sequence[Trial]) -> np.ndarray: ...


def targets_of(space: Space) -> Targets:
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
    cand = space.decode(x)
    z = space.encode(cand)
    key = cand.key()
    xs = tuple(float(v) for v in np.clip(x if asked is None else asked, 0, 1))
    zs = tuple(float(v) for v in z)
    if cache is not None and key in cache:
        hit = cache[key]
        res = EvalResult(
            **{**hit.to_dict(), "thresholds": hit.thresholds, "wall_s": 0.0, "extra": {**hit.extra, "cached": True}}
        )
        return Trial(index, xs, zs, cand, res)
    try:
        res = evaluator(cand)
    except BouteError as exc:
        return Trial(index, xs, zs, cand, None, status="failed", error=str(exc))
    if cache is not None:
        cache[key] = res
    return Trial(index, xs, zs, cand, res)


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
) -> list[Trial]:
    """Run until ``max_evals`` trials were evaluated or the chosen plan converged; ``trials`` resumes a run.

    ``screen``: project and screen every proposal first (module doc); screened trials are recorded (and
    passed to ``on_trial``) but not evaluated and not counted in ``max_evals``, ``patience`` or ``min_trials``.
    """
    done = list(trials)
    bind = getattr(strategy, "bind", None)
    if callable(bind):  # e.g. MOBO takes the evaluator's exact quality function
        bind(evaluator)
    use_screen = getattr(strategy, "use_screen", None)
    if screen is not None and callable(use_screen):  # e.g. MOBO screens its acquisition pool too
        use_screen(screen)
    cache = {t.candidate.key(): t.result for t in done if t.ok and t.result is not None}
    targets = targets_of(space)
    tracker = ChoiceTracker(targets, objective)
    for t in done:
        tracker.add(t)
    evaluated = sum(t.evaluated for t in done)
    run = 0
    while evaluated < max_evals and not converged(tracker, targets, patience, min_trials):
        x = np.asarray(strategy.ask(done), dtype=float).reshape(-1)
        if screen is not None:
            xp, cand, why = screen.admit(x)
            if why is not None:
                z = tuple(float(v) for v in space.encode(cand))
                trial = Trial(len(done), tuple(float(v) for v in np.clip(x, 0, 1)), z, cand, None, SCREENED, why)
                if on_trial is not None:
                    on_trial(trial)
                done.append(trial)
                run += 1
                if run >= SCREENED_RUN_LIMIT:
                    break
                continue
            trial = evaluate_point(space, evaluator, xp, len(done), cache, asked=x)
        else:
            trial = evaluate_point(space, evaluator, x, len(done), cache)
        run = 0
        if on_trial is not None:
            on_trial(trial)  # persisted before it counts: a crash after this line loses nothing
        done.append(trial)
        tracker.add(trial)
        evaluated += 1
    return done
