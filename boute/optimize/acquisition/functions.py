"""The acquisition functions :class:`~boute.optimize.strategies.mobo.MoboStrategy` scores its pool of plans with.

Each takes BoTorch models whose outputs are the search's outcomes and returns one log-score per pool point
(``Z``: canonical plans, shape ``(n, 1, dim)``). The models are built by the strategy: exact quality and
``-$/h`` as deterministic models, ``-log P95`` as the latency GP (or, with a cheaper evaluator as a prior,
that evaluator's figure plus the GP's residual: ``lat`` then holds both, and their outputs add up). The
strategy decides which acquisition runs and masks plans below the quality floor; this module only scores.

``pending``: plans proposed and not evaluated yet (the batch in flight, :mod:`boute.optimize.loop`), as
BoTorch's ``X_pending``: the MC acquisitions score each pool plan jointly with them, so a plan whose outcome
the pending ones would already deliver gains little (qLogEI: the improvement of the best of the plan and the
pending ones; qLogNEHVI: the pending points join the baseline through its cached box decompositions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from botorch.acquisition import AcquisitionFunction
    from botorch.models.model import Model
    from botorch.sampling.base import MCSampler
    from torch import Tensor

#: pool points scored per batch (bounds the MC tensors' size)
BATCH = 256


def _first_output(Y: Tensor, X: Tensor | None = None) -> Tensor:
    """MC objective: the first outcome (``-$/h`` of the cost acquisition)."""
    return Y[..., 0]


def _sum_outputs(Y: Tensor, X: Tensor | None = None) -> Tensor:
    """MC objective: the sum of the outcomes (``-log P95`` = prior + residual GP)."""
    return Y.sum(dim=-1)


def mc_sampler(model: Model, Z: Tensor, n: int, seed: int) -> MCSampler:
    """BoTorch's sampler for ``model``'s posterior (a ``ListSampler`` for a ``ModelList``), seeded."""
    import torch
    from botorch.sampling.get_sampler import get_sampler

    # botorch annotates get_sampler's argument as TorchPosterior, but it dispatches on any Posterior and a
    # ModelList's is a PosteriorList: the annotation is narrower than the function
    return get_sampler(model.posterior(Z[:1]), torch.Size([n]), seed=seed)  # type: ignore[arg-type]


def _score(acq: AcquisitionFunction, Z: Tensor) -> np.ndarray:
    import torch

    with torch.no_grad():
        return torch.cat([acq(b) for b in Z.split(BATCH)]).numpy().astype(float)


def log_cei_cost(
    neg_cost: Model,
    lat: Sequence[Model],
    Z: Tensor,
    *,
    best_cost: float,
    cap: float,
    mc_samples: int,
    seed: int,
    pending: Tensor | None = None,
) -> np.ndarray:
    """Constrained qLogEI on ``-$/h`` (exact) with the outcome constraint ``P95 <= cap`` (latency models).

    The improvement is deterministic (cost is known), so this is the cost saving over the cheapest plan
    meeting the targets, weighted by the probability that the plan meets the cap.
    """
    from botorch.acquisition.logei import qLogExpectedImprovement
    from botorch.acquisition.objective import GenericMCObjective
    from botorch.models.model import ModelList

    model = ModelList(neg_cost, *lat)
    acq = qLogExpectedImprovement(
        model=model,
        best_f=-best_cost,
        sampler=mc_sampler(model, Z, mc_samples, seed),
        objective=GenericMCObjective(_first_output),
        # feasible when -log P95 (the latency outputs' sum) >= -log cap
        constraints=[lambda Y: -math.log(cap) - Y[..., 1:].sum(dim=-1)],
        X_pending=pending,
    )
    return _score(acq, Z)


def log_ei(
    lat: Sequence[Model], Z: Tensor, *, best: float, mc_samples: int, seed: int, pending: Tensor | None = None
) -> np.ndarray:
    """Log expected improvement of ``-log P95`` over the incumbent ``best``.

    Analytic LogEI on one GP with nothing pending; else BoTorch's qLogEI, on the sum of the outputs with a
    prior (``lat`` = [prior, residual GP]).
    """
    if len(lat) == 1 and pending is None:
        from botorch.acquisition.analytic import LogExpectedImprovement

        return _score(LogExpectedImprovement(lat[0], best_f=best, maximize=True), Z)
    from botorch.acquisition.logei import qLogExpectedImprovement
    from botorch.acquisition.objective import GenericMCObjective
    from botorch.models.model import ModelList

    model = ModelList(*lat) if len(lat) > 1 else lat[0]
    acq = qLogExpectedImprovement(
        model=model,
        best_f=best,
        sampler=mc_sampler(model, Z, mc_samples, seed),
        objective=GenericMCObjective(_sum_outputs) if len(lat) > 1 else None,
        X_pending=pending,
    )
    return _score(acq, Z)


def log_nehvi(
    quality: Model,
    lat: Sequence[Model],
    X: Tensor,
    Z: Tensor,
    *,
    ref: Sequence[float],
    neg_cost: Model | None = None,
    mc_samples: int,
    seed: int,
    pending: Tensor | None = None,
) -> np.ndarray:
    """qLogNEHVI of (exact quality, ``-log P95``[, exact ``-$/h``]) with the reference point ``ref`` at the
    targets, so only the region meeting them counts; ``X`` are the evaluated plans (the noisy baseline)."""
    import torch
    from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
    from botorch.models.model import ModelList

    from boute.optimize.acquisition.fused_kernel import use_prebuilt

    use_prebuilt()  # BoTorch's fused kernel as make install built it, never compiled mid-search
    models = [quality, *lat] + ([neg_cost] if neg_cost is not None else [])
    model = ModelList(*models)
    n_lat = len(lat)
    objective = None
    if n_lat > 1:  # outcomes (quality, -log P95 = the latency outputs' sum[, -$/h])
        from botorch.acquisition.multi_objective.objective import GenericMCMultiOutputObjective

        def outcomes(Y: torch.Tensor, X: torch.Tensor | None = None) -> torch.Tensor:
            parts = [Y[..., :1], Y[..., 1 : 1 + n_lat].sum(dim=-1, keepdim=True), Y[..., 1 + n_lat :]]
            return torch.cat(parts, dim=-1)

        objective = GenericMCMultiOutputObjective(outcomes)
    acq = qLogNoisyExpectedHypervolumeImprovement(
        model=model,
        ref_point=list(ref),
        objective=objective,
        X_baseline=X,
        sampler=mc_sampler(model, X, mc_samples, seed),
        prune_baseline=True,
        cache_root=False,
        X_pending=pending,
    )
    return _score(acq, Z)
