"""Random search (strategy ``random``): uniform points of the unit box, the baseline every search must beat.

Point ``i`` is ``U[0, 1]^d`` drawn from a generator seeded by ``(seed, i)``, so it depends on nothing else:
a batch of ``q`` is the same points ``q`` sequential asks make, and a resumed search asks what the
interrupted one would have. The harness's screens then move its routing onto the quality floor and drop
plans over the capacity bound, as for every strategy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from boute.optimize.objectives import Objective
from boute.optimize.space import Space
from boute.optimize.strategies.base import Strategy
from boute.optimize.trials import Trial


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
