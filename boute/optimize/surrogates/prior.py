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

#: new plans from which a pool's prior goes to the batch function (:meth:`PriorLatency.use_many`): below it,
#: handing them to worker processes costs more than it saves (a plan of the built-in scenario takes ~0.2 ms);
#: also the size of each part handed over while the pool is being built (:meth:`PriorLatency.prefetch`)
MANY_FROM = 256

#: the figures of many candidates, started now: called with the candidates, it returns the function that waits
#: for their P95s (in order)
SoonMany = Callable[[Sequence[Candidate]], Callable[[], Sequence[float]]]


class PriorLatency:
    """``m(x)``, the prior evaluator's clipped ``-log P95``, cached per plan (module doc)."""

    def __init__(self, p95: Callable[[Candidate], float], space: Space, clip_factor: float) -> None:
        """``p95``: the cheaper evaluator's P95 of a candidate, in seconds."""
        self.p95 = p95
        self.space = space
        self.clip_factor = clip_factor
        self._cache: dict[str, float] = {}
        #: the P95 of many candidates at once (:meth:`use_many`), or None: one at a time with ``p95``
        self._many: SoonMany | None = None
        #: plans handed to ``_many`` by :meth:`prefetch` and not yet received, and the ones waiting to be handed
        self._pending: list[tuple[list[str], Callable[[], Sequence[float]]]] = []
        self._asked: set[str] = set()
        self._queued: dict[str, Candidate] = {}

    def use_many(self, p95_soon: SoonMany) -> None:
        """Compute a pool's new plans with ``p95_soon`` (the same figures as ``p95``, e.g. by worker
        processes: :meth:`boute.optimize.evaluators.pool.EvaluatorPool.prior_p95_soon`) when there are at least
        :data:`MANY_FROM` of them, or when :meth:`prefetch` handed some over already."""
        self._many = p95_soon

    def prefetch(self, key: str, cand: Candidate) -> None:
        """A plan (``key``: its :meth:`~Candidate.key`) the next :meth:`model` will be asked about, known before
        the pool is complete: with a batch function, each :data:`MANY_FROM` such new plans are handed over at
        once, so their figures are computed (by the workers) while the caller builds the rest of the pool.
        Without one, nothing happens."""
        if self._many is None:
            return
        if key in self._cache or key in self._asked or key in self._queued:
            return
        self._queued[key] = cand
        if len(self._queued) >= MANY_FROM:
            self._hand_over()

    def _hand_over(self) -> None:
        assert self._many is not None
        keys = list(self._queued)
        self._pending.append((keys, self._many(list(self._queued.values()))))
        self._asked.update(keys)
        self._queued = {}

    def _receive(self) -> None:
        """Wait for the figures :meth:`prefetch` asked for and cache them."""
        for keys, figures in self._pending:
            for k, p in zip(keys, figures(), strict=True):
                self._cache[k] = self._clipped(p)
        self._pending.clear()
        self._asked.clear()

    def _clipped(self, p95: float) -> float:
        cap = self.space.scenario.targets.p95_latency_s
        return -math.log(min(max(float(p95), 1e-6), self.clip_factor * cap))

    def y(self, cand: Candidate) -> float:
        """``-log min(max(P95, 1e-6), clip x cap)`` of ``cand`` by the prior evaluator."""
        return self._y(cand.key(), cand)

    def _y(self, key: str, cand: Candidate) -> float:
        """:meth:`y` of ``cand``, whose :meth:`~Candidate.key` is ``key``."""
        if key not in self._cache:
            self._cache[key] = self._clipped(self.p95(cand))
        return self._cache[key]

    def _fill(self, keys: Sequence[str], candidates: Sequence[Candidate]) -> None:
        """Compute the candidates not cached yet in one call of the batch function, where there are enough or
        where :meth:`prefetch` handed parts of this pool over already (the workers are at it: the rest joins
        them); first receive what was handed over."""
        if self._many is None:
            return
        streamed = bool(self._pending)
        self._queued.clear()  # asked for again below, with the rest
        self._receive()
        new: dict[str, Candidate] = {}
        for k, c in zip(keys, candidates, strict=True):
            if k not in self._cache:
                new.setdefault(k, c)
        if not new or (len(new) < MANY_FROM and not streamed):
            return
        for k, p in zip(new, self._many(list(new.values()))(), strict=True):
            self._cache[k] = self._clipped(p)

    def model(self, z: Sequence[np.ndarray], candidates: Sequence[Candidate]) -> Model:
        """``m`` as a deterministic BoTorch model over canonical points; ``z``/``candidates``: the points it
        will be asked about (the pool and the trials), looked up instead of decoded."""
        from botorch.models.deterministic import GenericDeterministicModel

        keys = [c.key() for c in candidates]
        self._fill(keys, candidates)
        known = {
            np.asarray(zi, dtype=float).tobytes(): self._y(k, c) for zi, k, c in zip(z, keys, candidates, strict=True)
        }
        space = self.space
        return GenericDeterministicModel(pointwise(lookup(known, lambda x: self.y(space.decode(x)))), num_outputs=1)
