"""The search harness every strategy runs in: ask -> decode -> evaluate -> record, on equal budgets.

Strategies are *stateless over history*: ``ask(trials)`` proposes the point for trial ``len(trials)``
from the trials so far, deterministically for a given seed. That is what makes resuming exact: a resumed
run hands the stored trials back and the next ask is the one the interrupted run would have made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from boute.errors import BouteError
from boute.optimize.evaluators import EvalResult, Evaluator
from boute.optimize.result import Trial, best_key_trace
from boute.optimize.space import Space
from boute.specs.targets import Targets


class Strategy(Protocol):
    name: str

    def ask(self, trials: Sequence[Trial]) -> np.ndarray: ...


def targets_of(space: Space) -> Targets:
    return space.scenario.goal


def converged(trials: Sequence[Trial], targets: Targets, patience: int | None, min_trials: int = 0) -> bool:
    """True when the chosen plan has not changed over the last ``patience`` trials (and one exists)."""
    if patience is None or len(trials) < max(min_trials, patience + 1):
        return False
    keys = best_key_trace(trials, targets)
    last = keys[-1]
    return last is not None and all(k == last for k in keys[-(patience + 1) :])


def evaluate_point(
    space: Space, evaluator: Evaluator, x: np.ndarray, index: int, cache: dict[str, EvalResult] | None = None
) -> Trial:
    """Decode ``x`` and evaluate it; a plan already evaluated is not re-evaluated (``cache``)."""
    cand = space.decode(x)
    z = space.encode(cand)
    key = cand.key()
    xs = tuple(float(v) for v in np.clip(x, 0, 1))
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
) -> list[Trial]:
    """Run until ``max_evals`` trials exist or the chosen plan converged; ``trials`` resumes a run."""
    done = list(trials)
    bind = getattr(strategy, "bind", None)
    if callable(bind):  # e.g. MOBO takes the evaluator's exact quality function
        bind(evaluator)
    cache = {t.candidate.key(): t.result for t in done if t.ok and t.result is not None}
    targets = targets_of(space)
    while len(done) < max_evals and not converged(done, targets, patience, min_trials):
        x = np.asarray(strategy.ask(done), dtype=float).reshape(-1)
        trial = evaluate_point(space, evaluator, x, len(done), cache)
        if on_trial is not None:
            on_trial(trial)  # persisted before it counts: a crash after this line loses nothing
        done.append(trial)
    return done
