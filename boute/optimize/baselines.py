"""Baselines in the same harness: random search, NSGA-II (pymoo, ask/tell), fixed strategies.

``random`` and ``nsga2`` implement the same ``ask(trials)`` contract as MOBO, so they are compared on equal
evaluation budgets and resume the same way. The fixed strategies are the paper's comparison points:
the large model alone on the best single GPU type, the large model alone on the heterogeneous pool,
both tiers with equal resources (RouteLLM-style), and MOBO restricted to one GPU type.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from boute.optimize.evaluators import OVERLOAD_P95_S
from boute.optimize.objectives import Objective
from boute.optimize.result import Trial
from boute.optimize.space import Candidate, Space
from boute.optimize.strategy import Strategy

if TYPE_CHECKING:
    from pymoo.core.population import Population


class RandomStrategy(Strategy):
    """Uniform points of the box; point ``i`` depends only on (seed, i), so resuming is exact."""

    name = "random"

    def __init__(self, space: Space, *, seed: int = 0, objective: Objective | str | None = None) -> None:
        """``objective`` is accepted for a uniform interface and ignored: the proposals do not depend on it."""
        self.space = space
        self.seed = seed

    def ask(self, trials: Sequence[Trial]) -> np.ndarray:
        return self._point(len(trials))

    def ask_batch(self, trials: Sequence[Trial], q: int) -> list[np.ndarray]:
        """Points ``len(trials) .. len(trials) + q - 1``: the same ones ``q`` sequential asks would make."""
        return [self._point(len(trials) + j) for j in range(max(1, q))]

    def _point(self, i: int) -> np.ndarray:
        return np.random.default_rng([self.seed, i]).random(self.space.dim)


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
        """The rest of the current generation, at most ``q`` of it (a generation is told once complete)."""
        n = len(trials)
        while self._batch is None or n >= self._start + len(self._batch):
            if self._batch is not None:
                self._tell(trials)
                self._start += len(self._batch)
            self._batch = self._algo.ask()
        X = self._batch.get("X")
        end = min(len(X), n - self._start + max(1, q))
        return [np.asarray(X[i], dtype=float) for i in range(n - self._start, end)]


# ---- fixed strategies (the paper's comparison points) -----------------------------------------------
def _max_replicas(space: Space, pair_index: int, config_index: int, budget: float) -> int:
    p = space.pairs[pair_index]
    c = p.configs[config_index]
    return int(min(p.inventory // c.gpus, math.floor(budget / (c.gpus * p.price) + 1e-9)))


def single_tier_single_gpu(space: Space, tier: int, fractions: tuple[float, ...]) -> list[Candidate]:
    """Every (GPU type, config) of ``tier`` with as many replicas as budget and inventory allow."""
    decode = _with_fractions(space, fractions)
    out = []
    for i, p in enumerate(space.pairs):
        if p.tier != tier:
            continue
        for k, _ in enumerate(p.configs):
            n = _max_replicas(space, i, k, space.budget)
            if n < 1:
                continue
            x = np.zeros(space.dim)
            x[p.count_dim] = n * p.configs[k].gpus / p.inventory
            if p.config_dim is not None:
                x[p.config_dim] = (k + 0.5) / len(p.configs)
            out.append(decode(x))
    return out


def equal_split(space: Space, fractions: tuple[float, ...]) -> list[Candidate]:
    """RouteLLM-style: each tier gets an equal share of the budget on one GPU type of its own choosing."""
    tiers = [t for t in space.active_tiers if fractions[t] > 0]
    share = space.budget / len(tiers)
    per_tier: list[list[tuple[int, int, int]]] = []
    for t in tiers:
        opts = []
        for i, p in enumerate(space.pairs):
            if p.tier != t:
                continue
            for k in range(len(p.configs)):
                n = _max_replicas(space, i, k, share)
                if n >= 1:
                    opts.append((i, k, n))
        per_tier.append(opts)
    decode = _with_fractions(space, fractions)
    out: list[Candidate] = []
    for combo in np.array(np.meshgrid(*[np.arange(len(o)) for o in per_tier])).T.reshape(-1, len(per_tier)):
        x = np.zeros(space.dim)
        used: dict[str, int] = {}
        ok = True
        for t_i, j in enumerate(combo):
            i, k, n = per_tier[t_i][int(j)]
            p = space.pairs[i]
            used[p.gpu] = used.get(p.gpu, 0) + n * p.configs[k].gpus
            ok &= used[p.gpu] <= p.inventory
            x[p.count_dim] = n * p.configs[k].gpus / p.inventory
            if p.config_dim is not None:
                x[p.config_dim] = (k + 0.5) / len(p.configs)
        if ok:
            out.append(decode(x))
    return out


def _with_fractions(space: Space, fractions: tuple[float, ...]) -> Callable[[np.ndarray], Candidate]:
    """A decoder of ``space``'s points with routing fixed to ``fractions``: the deployment part of ``x``
    decoded in the fixed-routing space, built once per family (building a space evaluates the performance
    model of every fitting config, far more than a decode)."""
    fixed = Space.build(space.scenario, gpus=space.gpus, tiers=space.active_tiers, fixed_fractions=fractions)
    skip = space.n_routing if fixed.n_routing == 0 else 0

    def decode(x: np.ndarray) -> Candidate:
        return fixed.decode(x[skip:])

    return decode
