"""The initial design of the model-based strategies (``mobo``, ``mobo-gp``): scrambled Sobol points.

A GP needs a spread of points before its acquisition means anything; a scrambled Sobol sequence covers the
unit box more evenly than uniform draws (low discrepancy). Point ``i`` depends only on (dim, seed, i),
however many points were drawn before, so a resumed search asks exactly what the interrupted one would have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from boute.optimize.trials import Trial


class SobolDesign:
    """Scrambled Sobol points of ``[0, 1]^dim``, deterministic in ``seed``; at least ``n`` are drawn at once."""

    def __init__(self, dim: int, seed: int, n: int) -> None:
        self.dim, self.seed, self.n = dim, seed, n
        self._points: np.ndarray | None = None

    def ask(self, trials: Sequence[Trial]) -> np.ndarray | None:
        """The next design point while the design lasts, else None (the model takes over). It lasts until ``n``
        trials cost an evaluation (a screened point does not count: the next Sobol point replaces it) and 3
        succeeded, the fewest a GP is fitted on."""
        if sum(t.evaluated for t in trials) < self.n or sum(t.ok for t in trials) < 3:
            return self.point(len(trials))
        return None

    def points(self, trials: Sequence[Trial], q: int) -> list[np.ndarray]:
        """The design's next ``q`` points at most (never past ``n`` evaluated trials): a batch of the design,
        the same points ``q`` sequential asks would make while nothing is screened."""
        left = max(1, self.n - sum(t.evaluated for t in trials))
        return [self.point(len(trials) + j) for j in range(min(max(1, q), left))]

    def point(self, i: int) -> np.ndarray:
        """Point ``i`` (the sequence is regrown to the next power of two when ``i`` is past its end; a
        scrambled Sobol sequence of a given seed keeps its prefix, so earlier points do not change)."""
        if self._points is None or len(self._points) <= i:
            from scipy.stats import qmc

            m = math.ceil(math.log2(max(self.n, i + 1, 2)))
            self._points = qmc.Sobol(self.dim, scramble=True, seed=self.seed).random_base2(m)
        return self._points[i]
