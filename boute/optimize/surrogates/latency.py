"""The latency GP of strategy ``mobo``: one ``SingleTaskGP`` on ``y = -log min(P95, clip x cap)``.

Why the log: P95 is positive and skewed, and the cap is a ratio target (``P95 <= cap`` is
``y >= -log cap``, a half-space). Why the clip: how badly an overloaded plan fails carries nothing the search
can use, and the cliff (an overloaded plan reports 3,600 s) would otherwise set the lengthscales.

Kernel (``kernel``): ``matern``, a scaled Matern-5/2 with ARD over all dims and BoTorch's dimension-scaled
lengthscale prior; or ``additive``, ``k_route + k_place + k_all`` (each scaled): routing and placement each
explain part of the latency, the full kernel their interaction. Outcomes are standardised
(``Standardize``); hyperparameters are fitted by maximum marginal likelihood (L-BFGS, ``fit_maxiter``
iterations for the first fit, ``warm_maxiter`` for the next ones), warm-started from the previous fit's: a
step adds a batch to dozens of trials, so the optimum moves little from the last one and a few iterations
reach it (on the built-in scenario's stored search, 20 warm iterations instead of 60 took the fits' CPU from
3.46 s to 1.49 s over its 11 steps, and 42 of the 44 plans proposed stayed the same). They are refitted when the trials have grown by a fraction
``refit_growth`` since the last fit, else the new GP takes the last fit's values: with ``n`` trials and ``b``
per step that is every step while ``n <= b / refit_growth`` and every ``~refit_growth * n / b`` steps after.
Why: the marginal likelihood of ``n`` points moves little when ``b`` more arrive once ``b << n``, while one
L-BFGS fit costs ``O(n^3)`` per iteration and had come to take ~1 s of every step at ``n`` = 450; small
searches (the CLI's 60 evaluations) still refit every step.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import numpy as np

from boute.optimize.space import Space
from boute.optimize.surrogates.warm import warm_state

if TYPE_CHECKING:
    from botorch.models import SingleTaskGP
    from gpytorch.kernels import Kernel
    from torch import Tensor

KERNELS = ("matern", "additive")


def latency_outcome(p95: np.ndarray, cap: float, clip_factor: float) -> np.ndarray:
    """``-log P95`` with P95 clipped to ``[1e-6, clip_factor x cap]`` (module doc): what the GP models."""
    return -np.log(np.clip(p95, 1e-6, clip_factor * cap))


class LatencyGP:
    """Fits the latency GP for each BO step (module doc), keeping the last fit as the next one's warm start."""

    def __init__(
        self,
        space: Space,
        kernel: str = "matern",
        refit_growth: float = 0.1,
        fit_maxiter: int = 60,
        warm_maxiter: int = 20,
    ) -> None:
        self.space = space
        self.kernel = kernel
        self.refit_growth = max(0.0, refit_growth)
        self.fit_maxiter = fit_maxiter
        self.warm_maxiter = warm_maxiter
        self.state: dict[str, Tensor] | None = None  # last fitted hyperparameters: the warm start
        self.fitted_on = 0  # trials at the last fit

    def covar(self) -> Kernel:
        from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior as dim_scaled
        from gpytorch.kernels import ScaleKernel

        route, place = self.space.routing_dims(), self.space.placement_dims()
        if self.kernel == "additive" and route:
            k_r = dim_scaled(ard_num_dims=len(route), active_dims=route)
            k_p = dim_scaled(ard_num_dims=len(place), active_dims=place)
            k_rp = dim_scaled(ard_num_dims=self.space.dim)
            return ScaleKernel(k_r) + ScaleKernel(k_p) + ScaleKernel(k_rp)
        return ScaleKernel(dim_scaled(ard_num_dims=self.space.dim))

    def fit(self, X: Tensor, y: Tensor) -> SingleTaskGP:
        """The GP on ``(X, y)`` (``y``: ``(n, 1)``) in eval mode; hyperparameters refitted on the first fit and
        whenever ``n >= (1 + refit_growth) x`` the last fit's ``n`` (module doc). A failed fit still leaves a
        usable model (the warm-started or prior hyperparameters)."""
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP
        from botorch.models.transforms.outcome import Standardize
        from gpytorch.mlls import ExactMarginalLogLikelihood

        gp = SingleTaskGP(X, y, covar_module=self.covar(), outcome_transform=Standardize(m=1))
        state = self.state
        cold = state is None
        if state is not None:
            gp.load_state_dict(state, strict=False)
        n = int(X.shape[0])
        if cold or n >= (1.0 + self.refit_growth) * self.fitted_on:
            self.fitted_on = n
            mll = ExactMarginalLogLikelihood(gp.likelihood, gp)
            with contextlib.suppress(Exception):
                fit_gpytorch_mll(
                    mll,
                    optimizer_kwargs={"options": {"maxiter": self.fit_maxiter if cold else self.warm_maxiter}},
                    max_attempts=3 if cold else 1,
                )
            self.state = warm_state(gp)
        gp.eval()
        return gp
