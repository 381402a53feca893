"""One model step's scoring of its candidate pool: the acquisition the step picked, over the pool's plans.

:mod:`boute.optimize.acquisition.functions` holds the acquisitions; this module builds what they are given for
one pool: the pool as a tensor, the exact outcomes (quality, ``-$/h``) as BoTorch deterministic models that
look pool plans up and compute any other point, and the quality floor's mask (a plan below the floor scores
``-inf``; the screen keeps most of them out of the pool anyway). Which acquisition runs is the strategy's
choice (:class:`boute.optimize.strategies.mobo.MoboStrategy`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from boute.optimize.acquisition import functions as acquisitions
from boute.optimize.acquisition.pool import Pool
from boute.optimize.space import Space
from boute.optimize.surrogates.exact import lookup, pointwise
from boute.specs.targets import meets_floor

if TYPE_CHECKING:
    from botorch.models.model import Model
    from torch import Tensor


@dataclass(frozen=True)
class PoolScores:
    """The inputs every acquisition of one step shares. ``lat``: the models whose outputs add up to
    ``-log P95`` (the GP, or a prior's figure and the GP's residual); ``pq``: the pool plans' exact quality;
    ``pending``: the batch in flight (BoTorch's ``X_pending``)."""

    space: Space
    pool: Pool
    lat: list[Model]
    pq: np.ndarray
    floor: float
    cap: float
    pending: Tensor | None
    mc_samples: int
    seed: int

    def log_cei_cost(self, best_cost: float) -> np.ndarray:
        """Constrained qLogEI on ``-$/h`` with ``P95 <= cap`` (:func:`acquisitions.log_cei_cost`)."""
        from botorch.models.deterministic import GenericDeterministicModel

        s = acquisitions.log_cei_cost(
            GenericDeterministicModel(self._neg_cost_fn(), num_outputs=1),
            self.lat,
            self._tensor(),
            best_cost=best_cost,
            cap=self.cap,
            mc_samples=self.mc_samples,
            seed=self.seed,
            pending=self.pending,
        )
        return self._floored(s)

    def log_ei(self, best: float) -> np.ndarray:
        """LogEI of ``-log P95`` over the incumbent ``best`` (:func:`acquisitions.log_ei`)."""
        s = acquisitions.log_ei(
            self.lat, self._tensor(), best=best, mc_samples=self.mc_samples, seed=self.seed, pending=self.pending
        )
        return self._floored(s)

    def log_nehvi(
        self, baseline: Tensor, quality: Callable[[tuple[float, ...]], float], budget: float | None = None
    ) -> np.ndarray:
        """qLogNEHVI of (exact quality, ``-log P95``) with the reference point at the targets; with ``budget``,
        of (exact quality, ``-log P95``, exact ``-$/h``), reference (floor, -log cap, -budget). ``baseline``:
        the noisy baseline (evaluated plans); ``quality``: the exact quality of a plan's fractions, for the
        points that are not pool plans (the baseline, the pending ones)."""
        from botorch.models.deterministic import GenericDeterministicModel

        space = self.space

        def exact(z: np.ndarray) -> float:
            return quality(tuple(space._fractions(z)))

        known = {z.tobytes(): float(v) for z, v in zip(self.pool.z, self.pq, strict=True)}
        known.update((z.tobytes(), exact(z)) for z in baseline.numpy())
        if self.pending is not None:
            known.update((z.tobytes(), exact(z)) for z in self.pending.numpy())
        neg_cost = None if budget is None else GenericDeterministicModel(self._neg_cost_fn(), num_outputs=1)
        return acquisitions.log_nehvi(
            GenericDeterministicModel(pointwise(lookup(known, exact)), num_outputs=1),
            self.lat,
            baseline,
            self._tensor(),
            ref=[self.floor, -math.log(self.cap)] + ([-budget] if budget is not None else []),
            neg_cost=neg_cost,
            mc_samples=self.mc_samples,
            seed=self.seed,
            pending=self.pending,
        )

    def _floored(self, scores: np.ndarray) -> np.ndarray:
        return np.where(meets_floor(self.pq, self.floor), scores, -np.inf)

    def _tensor(self) -> Tensor:
        import torch

        return torch.tensor(self.pool.z, dtype=torch.double).unsqueeze(1)

    def _neg_cost_fn(self) -> Callable[[Tensor], Tensor]:
        """``-$/h`` of canonical points as a torch function: pool plans by lookup, others by decoding."""
        known = {z.tobytes(): -cd.cost_per_hour for z, cd in zip(self.pool.z, self.pool.candidates, strict=True)}
        space = self.space
        return pointwise(lookup(known, lambda z: -space.decode(z).cost_per_hour))
