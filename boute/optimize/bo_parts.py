"""Pieces both MOBO strategies share (:mod:`boute.optimize.mobo`, :mod:`boute.optimize.mobo_gp`).

* :class:`SobolDesign`: the initial design, scrambled Sobol points of the unit box, and when it ends. Point
  ``i`` depends only on (dim, seed, i), however many points were drawn before, so a resumed search asks
  exactly what the interrupted one would have.
* :func:`warm_state`: what a GP's next fit starts from (its hyperparameters, not its outcome scaling).
* :func:`pointwise`: an exact outcome of one encoded point (quality, ``-$/h``, a cheaper evaluator's
  ``-log P95``) as the batched torch function a BoTorch ``GenericDeterministicModel`` calls.

Torch is imported only when a function is built: importing this module stays light.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module

    from boute.optimize.result import Trial


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


def pointwise(value: Callable[[np.ndarray], float]) -> Callable[[Tensor], Tensor]:
    """``Z (..., d) -> (..., 1)``: ``value`` (a function of one point, as float64 numpy) over a batch."""
    import torch

    def batched(Z: Tensor) -> Tensor:
        flat = Z.detach().reshape(-1, Z.shape[-1]).cpu().numpy().astype(float)
        return torch.tensor([value(z) for z in flat], dtype=Z.dtype).reshape(*Z.shape[:-1], 1)

    return batched


def warm_state(gp: Module) -> dict[str, Tensor]:
    """A copy of ``gp``'s state without its outcome transform: the next step's GP loads it as a warm start,
    while its ``Standardize`` is refitted to the new data (loaded, the old scaling would be wrong)."""
    return {k: v.detach().clone() for k, v in gp.state_dict().items() if not k.startswith("outcome_transform")}
