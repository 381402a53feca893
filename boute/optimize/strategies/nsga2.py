"""NSGA-II (strategy ``nsga2``): pymoo's genetic algorithm driven ask/tell from the trials.

Objectives by ``objective`` (all minimised): ``latency`` ``(-quality, log P95)``, ``cost`` ``($/h, log P95)``,
``pareto`` ``(-quality, log P95, $/h)``; constraints ``floor - quality <= 0`` and ``log P95 - log cap <= 0``
(pymoo's constraint domination: a feasible plan beats an infeasible one, infeasible ones rank by violation).
A failed or screened trial is told as overloaded (:data:`~boute.optimize.evaluators.base.OVERLOAD_P95_S`,
quality 0). A generation is told once all its members are trials, so the algorithm's state is a replay of
the trials: resuming is exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from boute.optimize.evaluators.base import OVERLOAD_P95_S
from boute.optimize.objectives import Objective
from boute.optimize.space import Space
from boute.optimize.status import TrialStatus
from boute.optimize.strategies.base import Strategy
from boute.optimize.trials import Trial

if TYPE_CHECKING:
    from pymoo.core.population import Population


class NSGA2Strategy(Strategy):
    """NSGA-II with constraint handling (pymoo ask/tell); replays told generations from the trials.

    Objectives by ``objective``: ``latency`` (-quality, log P95), ``cost`` ($/h, log P95), ``pareto``
    (-quality, log P95, $/h); constraints ``floor - quality <= 0`` and ``log P95 - log cap <= 0`` always.
    """

    name = "nsga2"

    def __init__(
        self, space: Space, *, seed: int = 0, pop_size: int = 12, objective: Objective | str = "latency"
    ) -> None:
        from pymoo.algorithms.moo.nsga2 import NSGA2
        from pymoo.core.problem import Problem
        from pymoo.core.termination import NoTermination

        self.space = space
        floor = space.scenario.targets.quality_floor
        self._floor = floor
        self._log_cap = math.log(space.scenario.targets.p95_latency_s)
        self._objective = objective.name if isinstance(objective, Objective) else objective
        n_obj = 3 if self._objective == "pareto" else 2
        problem = Problem(n_var=space.dim, n_obj=n_obj, n_ieq_constr=2, xl=0.0, xu=1.0)
        self._algo = NSGA2(pop_size=pop_size)
        self._algo.setup(problem, termination=NoTermination(), seed=seed, verbose=False)
        self._problem = problem
        self._batch: Population | None = None  # asked last
        self._start = 0  # trial index of its first member

    def _tell(self, trials: Sequence[Trial]) -> None:
        from pymoo.core.evaluator import Evaluator
        from pymoo.problems.static import StaticProblem

        pop = self._batch
        assert pop is not None  # ask() tells a batch only after asking it
        F, G = [], []
        for t in trials[self._start : self._start + len(pop)]:
            if t.ok:
                q, p = t.checked_result.quality, t.checked_result.p95_latency_s
            else:
                q, p = 0.0, OVERLOAD_P95_S
            lp = math.log(max(p, 1e-6))
            c = t.candidate.cost_per_hour
            F.append({"cost": [c, lp], "pareto": [-q, lp, c]}.get(self._objective, [-q, lp]))
            G.append([self._floor - q, lp - self._log_cap])
        Evaluator().eval(StaticProblem(self._problem, F=np.array(F), G=np.array(G)), pop)
        self._algo.tell(infills=pop)

    def ask(self, trials: Sequence[Trial]) -> np.ndarray:
        return self.ask_batch(trials, 1)[0]

    def ask_batch(self, trials: Sequence[Trial], q: int) -> list[np.ndarray]:
        """The rest of the current generation, at most ``q`` of it (a generation is told once complete); none
        while a generation to tell has members in flight (:attr:`TrialStatus.PENDING`): the loop then waits for
        their results and asks again."""
        n = len(trials)
        while self._batch is None or n >= self._start + len(self._batch):
            if self._batch is not None:
                members = trials[self._start : self._start + len(self._batch)]
                if any(t.status == TrialStatus.PENDING for t in members):
                    return []
                self._tell(trials)
                self._start += len(self._batch)
            self._batch = self._algo.ask()
        X = self._batch.get("X")
        end = min(len(X), n - self._start + max(1, q))
        return [np.asarray(X[i], dtype=float) for i in range(n - self._start, end)]
