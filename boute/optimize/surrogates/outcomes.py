"""One GP per outcome, for strategy ``mobo-gp``: ``logit(quality)`` and ``-log P95``, a ``ModelListGP``.

Used when quality is measured on a sample (``live``) rather than known exactly. Why the transforms: quality
lies in (0, 1) and P95 is positive and skewed; ``logit`` and ``-log`` make both unbounded and roughly
symmetric, and the constraints ``quality >= floor`` and ``P95 <= cap`` stay half-spaces in them.

Kernel: additive over the decision's structure, ``k_route + k_place + k_route * k_place`` (each a Matern-5/2
with ARD and dimension-scaled lengthscale priors, scaled): routing and placement each explain a part of the
outcome and their interaction the rest, which needs fewer points than one kernel over all dims. Without
routing dims (fixed fractions), one Matern over the placement dims. Hyperparameters are fitted by
maximising the summed marginal likelihood every ``refit_every`` steps, warm-started from the last fit; in
between the GPs are only conditioned on the new data (the fit dominates the cost of a step).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np

from boute.optimize.space import Space
from boute.optimize.surrogates.warm import warm_state

if TYPE_CHECKING:
    from botorch.models import ModelListGP
    from gpytorch.kernels import Kernel
    from torch import Tensor

#: how far inside (0, 1) quality is kept before its logit
EPS = 1e-4


def logit(q: np.ndarray) -> np.ndarray:
    """``log(q / (1 - q))`` with ``q`` kept ``EPS`` inside (0, 1): the quality outcome the GP models."""
    q = np.clip(q, EPS, 1 - EPS)
    return np.log(q / (1 - q))


class OutcomeGPs:
    """Fits the outcome GPs for each BO step (module doc), keeping the last fit as the next one's warm start."""

    def __init__(self, space: Space, refit_every: int = 6, fit_maxiter: int = 75) -> None:
        self.space = space
        self.refit_every = refit_every
        self.fit_maxiter = fit_maxiter
        self.steps = 0
        self.state: list[dict[str, Tensor]] | None = None  # last fitted hyperparameters: the warm start

    def covar(self) -> Kernel:
        from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior as matern
        from gpytorch.kernels import ProductKernel, ScaleKernel

        route = self.space.routing_dims()
        place = self.space.placement_dims()
        if not route:
            return matern(ard_num_dims=len(place), active_dims=place)
        k_r = matern(ard_num_dims=len(route), active_dims=route)
        k_p = matern(ard_num_dims=len(place), active_dims=place)
        k_rp = ProductKernel(
            matern(ard_num_dims=len(route), active_dims=route), matern(ard_num_dims=len(place), active_dims=place)
        )
        return ScaleKernel(k_r) + ScaleKernel(k_p) + ScaleKernel(k_rp)

    def fit(self, X: Tensor, Y: Tensor) -> ModelListGP:
        """One standardised ``SingleTaskGP`` per column of ``Y``, in eval mode (a failed hyperparameter fit
        still leaves a usable prior or warm-started model)."""
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import ModelListGP, SingleTaskGP
        from botorch.models.transforms.outcome import Standardize
        from gpytorch.mlls import SumMarginalLogLikelihood

        models = [
            SingleTaskGP(X, Y[:, i : i + 1], covar_module=self.covar(), outcome_transform=Standardize(m=1))
            for i in range(Y.shape[-1])
        ]
        model = ModelListGP(*models)
        if self.state is not None:
            for m, st in zip(models, self.state, strict=True):
                m.load_state_dict(st, strict=False)
        if self.state is None or self.steps % self.refit_every == 0:
            mll = SumMarginalLogLikelihood(model.likelihood, model)
            with contextlib.suppress(Exception):
                fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": self.fit_maxiter}})
            self.state = [warm_state(m) for m in models]
        self.steps += 1
        model.eval()
        return model
