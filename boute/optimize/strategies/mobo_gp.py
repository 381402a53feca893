"""MOBO with a GP for quality *and* latency (strategy ``mobo-gp``): qLogNEHVI on two learned outcomes.

The first design, and still the one for evaluators whose quality is measured on a sample (``live``): with
an exact quality model :mod:`boute.optimize.strategies.mobo` (strategy ``mobo``) needs fewer evaluations; the bench
measures both.

* Outcomes modelled: ``logit(quality)`` and ``-log(P95)``, one GP each, with an additive kernel that mirrors
  the decision structure (:mod:`boute.optimize.surrogates.outcomes`).
* Outcome constraints ``quality >= floor`` and ``P95 <= cap`` enter qLogNEHVI as constraint callables; the
  budget, inventory and fit are hard and built into the space (no infeasible candidate is ever proposed).
* Mixed variables: GPU shares are ordinal and (TP, PP) is categorical; ``optimize_acqf_mixed_alternating``
  optimises over them directly (``acq_optimizer="relaxed"`` falls back to a continuous relaxation).
* Initial design: scrambled Sobol points (``n_init``), deterministic in the seed.
* ``objective`` ``cost`` / ``pareto``: $/h (exact, a function of the deployment) joins as a third outcome of
  the hypervolume (reference at the budget); the objective's rule then picks the plan from the trials.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from boute.optimize.clock import SearchClock
from boute.optimize.objectives import Objective
from boute.optimize.space import Space
from boute.optimize.status import TrialStatus
from boute.optimize.strategies.base import Strategy
from boute.optimize.strategies.design import SobolDesign
from boute.optimize.surrogates.exact import pointwise
from boute.optimize.surrogates.outcomes import EPS, OutcomeGPs, logit
from boute.optimize.trials import Trial, figures

if TYPE_CHECKING:
    from botorch.models.model import Model


class GPMoboStrategy(Strategy):
    """``ask(trials)``: Sobol for the first ``n_init`` trials, then the qLogNEHVI maximiser."""

    name = "mobo-gp"

    def __init__(
        self,
        space: Space,
        *,
        seed: int = 0,
        n_init: int | None = None,
        num_restarts: int = 2,
        raw_samples: int = 64,
        mc_samples: int = 32,
        acq_optimizer: str = "relaxed",
        threads: int = 1,
        refit_every: int = 6,
        objective: Objective | str = "latency",
    ) -> None:
        self.space = space
        self.with_cost = (objective.name if isinstance(objective, Objective) else objective) != "latency"
        self.seed = seed
        self.n_init = n_init if n_init is not None else max(8, min(space.dim, 12))
        self.num_restarts = num_restarts
        self.raw_samples = raw_samples
        self.mc_samples = mc_samples
        self.acq_optimizer = acq_optimizer
        self.threads = threads
        self.clock = SearchClock()  # the loop's, once it hands it over (use_clock)
        self.steps: list[str] = []  # one entry per BO step (its acquisition: qLogNEHVI)
        self._design = SobolDesign(space.dim, seed, self.n_init)
        self.gps = OutcomeGPs(space, refit_every)

    def use_clock(self, clock: SearchClock) -> None:
        """Time the GP fits and the acquisition's optimisation as sub-phases of ``propose``."""
        self.clock = clock

    # ---- initial design -------------------------------------------------------------------------
    def _fallback(self, i: int) -> np.ndarray:
        return np.random.default_rng([self.seed, i, 7]).random(self.space.dim)

    # ---- BO step --------------------------------------------------------------------------------
    def ask(self, trials: Sequence[Trial]) -> np.ndarray:
        x0 = self._design.ask(trials)
        if x0 is not None:
            return x0
        x = self._bo_step([t for t in trials if t.ok], [t.z for t in trials if t.status == TrialStatus.PENDING])
        seen = {t.candidate.key() for t in trials}
        if self.space.decode(x).key() in seen:
            return self._fallback(len(trials))  # the acquisition maximiser is a plan already evaluated: explore instead
        return x

    def _bo_step(self, ok: Sequence[Trial], pending: Sequence[tuple[float, ...]] = ()) -> np.ndarray:
        """The acquisition's maximiser, with ``pending`` (the batch in flight) as BoTorch's ``X_pending``."""
        import torch
        from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement
        from botorch.sampling import SobolQMCNormalSampler

        from boute.optimize.acquisition.fused_kernel import use_prebuilt

        use_prebuilt()  # BoTorch's fused kernel as make install built it, never compiled mid-search
        torch.set_num_threads(self.threads)
        torch.manual_seed(self.seed * 100003 + len(ok))
        sc = self.space.scenario
        X = torch.tensor(np.array([t.z for t in ok]), dtype=torch.double)
        _, q, p, _ = figures(ok)
        # latency far beyond the cap carries no information the GP can use: clip it (10x cap) so overloaded
        # plans do not dominate the lengthscales
        p = np.clip(p, 1e-6, 10.0 * sc.targets.p95_latency_s)
        Y = torch.tensor(np.stack([logit(q), -np.log(p)], axis=1), dtype=torch.double)
        t0 = time.perf_counter()
        gps = self.gps.fit(X, Y)
        model: Model = gps
        t1 = time.perf_counter()
        floor = float(logit(np.array([max(sc.targets.quality_floor, EPS)]))[0])
        neg_log_cap = -math.log(sc.targets.p95_latency_s)
        ref = [floor if sc.targets.quality_floor > 0 else float(Y[:, 0].min()) - 0.1, neg_log_cap]
        constraints = [lambda Z: neg_log_cap - Z[..., 1]]
        if sc.targets.quality_floor > 0:
            constraints.append(lambda Z: floor - Z[..., 0])
        if self.with_cost:
            from botorch.models.deterministic import GenericDeterministicModel
            from botorch.models.model import ModelList

            space = self.space

            def neg_cost(z: np.ndarray) -> float:
                return -space.decode(z).cost_per_hour

            model = ModelList(*gps.models, GenericDeterministicModel(pointwise(neg_cost), num_outputs=1))
            ref = [*ref, -space.budget]
        acq = qLogNoisyExpectedHypervolumeImprovement(
            model=model,
            ref_point=ref,
            X_baseline=X,
            sampler=SobolQMCNormalSampler(sample_shape=torch.Size([self.mc_samples]), seed=self.seed),
            constraints=constraints,
            prune_baseline=True,
            X_pending=torch.tensor(np.array(pending), dtype=torch.double) if pending else None,
        )
        d = self.space.dim
        bounds = torch.stack([torch.zeros(d), torch.ones(d)]).double()
        if self.acq_optimizer == "mixed":
            from botorch.optim.optimize_mixed import optimize_acqf_mixed_alternating

            cand, _ = optimize_acqf_mixed_alternating(
                acq,
                bounds,
                discrete_dims=self.space.discrete_dims(),
                cat_dims=self.space.categorical_dims() or None,
                num_restarts=self.num_restarts,
                raw_samples=self.raw_samples,
                options={"maxiter_alternating": 2, "maxiter_continuous": 25, "maxiter_discrete": 2},
            )
        else:
            from botorch.optim import optimize_acqf

            cand, _ = optimize_acqf(
                acq,
                bounds,
                q=1,
                num_restarts=self.num_restarts,
                raw_samples=self.raw_samples,
                options={"maxiter": 40},
            )
        self.clock.add("propose.fit", t1 - t0)
        self.clock.add("propose.acquisition", time.perf_counter() - t1)
        self.steps.append("nehvi")
        return cand.detach().cpu().numpy().reshape(-1)
