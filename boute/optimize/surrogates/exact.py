"""Outcomes known exactly before any evaluation, as functions BoTorch's deterministic models call.

Quality depends only on the routing part of a plan and is a cheap known function of it (the quality
model's policy quality, ~10 us a call); ``-$/h`` depends only on the deployment. Inside an acquisition they
enter as ``GenericDeterministicModel(pointwise(f))`` in a ``ModelList`` beside the GP, so an objective or a
constraint on them (``quality >= floor``, the cost saving) is exact, not a GP's guess.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from boute.optimize.evaluators.base import Evaluator, policy_of

if TYPE_CHECKING:
    from torch import Tensor

#: quality as a function of the routing fractions
QualityFn = Callable[[tuple[float, ...]], float]


def exact_quality_fn(evaluator: Evaluator) -> QualityFn | None:
    """The evaluator's quality as a function of routing fractions, when it has an exact model (else None)."""
    model = evaluator.quality_model
    if model is None:
        return None
    mode = evaluator.mode
    return lambda fr: float(policy_of(model, mode, tuple(fr)).quality)


class ExactQuality:
    """``quality_fn`` memoised on the fractions rounded to 1e-9 (the pools score the same routings often)."""

    def __init__(self, quality_fn: QualityFn) -> None:
        self.quality_fn = quality_fn
        self._cache: dict[tuple[float, ...], float] = {}

    def __call__(self, fractions: tuple[float, ...]) -> float:
        key = tuple(round(f, 9) for f in fractions)
        if key not in self._cache:
            self._cache[key] = self.quality_fn(fractions)
        return self._cache[key]


def pointwise(value: Callable[[np.ndarray], float]) -> Callable[[Tensor], Tensor]:
    """``Z (..., d) -> (..., 1)``: ``value`` (a function of one point, as float64 numpy) over a batch."""
    import torch

    def batched(Z: Tensor) -> Tensor:
        flat = Z.detach().reshape(-1, Z.shape[-1]).cpu().numpy().astype(float)
        return torch.tensor([value(z) for z in flat], dtype=Z.dtype).reshape(*Z.shape[:-1], 1)

    return batched


def lookup(known: Mapping[bytes, float], compute: Callable[[np.ndarray], float]) -> Callable[[np.ndarray], float]:
    """``z -> known[z.tobytes()]``, else ``compute(z)``: the pool's plans are decoded once, not per MC sample."""

    def value(z: np.ndarray) -> float:
        v = known.get(z.tobytes())
        return compute(z) if v is None else v

    return value
