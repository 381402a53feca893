"""A cheaper evaluator as the latency GP's known mean (strategy ``mobo`` with ``prior``).

When the search evaluator is the simulator (or live), the fast path still knows the *shape* of the latency
surface in milliseconds. So the outcome is split as ``y(x) = m(x) + r(x)``: ``m(x) = -log P95_fast(x)``
(clipped as the trials' are), a deterministic model, and ``r ~ GP`` fitted to the residuals
``y_i - m(x_i)`` of the faithful trials. The acquisitions see ``m + r`` as one outcome (a sum of the two
models' outputs inside BoTorch's MC acquisitions), so a handful of faithful results corrects the fast path
everywhere instead of being the GP's only knowledge of the space.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from boute.optimize.space import Candidate, Space
from boute.optimize.surrogates.exact import lookup, pointwise

if TYPE_CHECKING:
    from botorch.models.model import Model


class PriorLatency:
    """``m(x)``, the prior evaluator's clipped ``-log P95``, cached per plan (module doc)."""

    def __init__(self, p95: Callable[[Candidate], float], space: Space, clip_factor: float) -> None:
        """``p95``: the cheaper evaluator's P95 of a candidate, in seconds."""
        self.p95 = p95
        self.space = space
        self.clip_factor = clip_factor
        self._cache: dict[str, float] = {}

    def y(self, cand: Candidate) -> float:
        """``-log min(max(P95, 1e-6), clip x cap)`` of ``cand`` by the prior evaluator."""
        key = cand.key()
        if key not in self._cache:
            cap = self.space.scenario.targets.p95_latency_s
            self._cache[key] = -math.log(min(max(float(self.p95(cand)), 1e-6), self.clip_factor * cap))
        return self._cache[key]

    def model(self, z: Sequence[np.ndarray], candidates: Sequence[Candidate]) -> Model:
        """``m`` as a deterministic BoTorch model over canonical points; ``z``/``candidates``: the points it
        will be asked about (the pool and the trials), looked up instead of decoded."""
        from botorch.models.deterministic import GenericDeterministicModel

        known = {np.asarray(zi, dtype=float).tobytes(): self.y(c) for zi, c in zip(z, candidates, strict=True)}
        space = self.space
        return GenericDeterministicModel(pointwise(lookup(known, lambda x: self.y(space.decode(x)))), num_outputs=1)
