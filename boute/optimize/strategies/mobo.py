"""Constrained multi-objective BO (BoTorch) that models only what is unknown: P95 latency.

Structure the method allows us to exploit (docs/optimizer.md, "MOBO"):

* **Quality is exact.** It depends only on the routing part and is a cheap, known function of it (the
  quality model's policy quality, ~10 us a call). It enters BoTorch as a ``GenericDeterministicModel`` in a
  ``ModelList`` beside the latency GP, so the quality objective and the ``quality >= floor`` constraint are
  exact inside the acquisition. The strategy gets that function from the evaluator (``bind``, called by
  ``run_search``) or from ``quality_fn``; without one it falls back to the first design (a GP for quality
  too, :mod:`boute.optimize.strategies.mobo_gp`, strategy ``mobo-gp``).
* **One GP, on ``-log P95``** (:mod:`boute.optimize.surrogates.latency`; P95 clipped at ``clip_factor`` x the cap: how badly an overloaded plan
  fails carries nothing the search can use, and the cliff would otherwise set the lengthscales).
* **Budget, inventory, fit** are hard limits built into the space (construction + repair).
* **Acquisition over a pool of canonical plans** (:mod:`boute.optimize.acquisition.pool`): local moves around
  the incumbents plus a global sample, each decoded and re-encoded, deduplicated and new. The GP is
  trained on canonical points and scores canonical points; no gradient steps in flat, rounded regions.
* **Two acquisitions, interleaved** (``acq="hybrid"``): qLogNEHVI on (exact quality, GP latency) with the
  reference point at the targets (floor, cap) so only the feasible region counts, and constrained
  LogEI on latency over plans whose exact quality meets the floor: the chosen plan is what users get, so
  two of every three steps improve it directly. ``acq="ehvi"`` / ``"ei"`` run one of them alone. The
  strategy builds the models and picks the acquisition; :mod:`boute.optimize.acquisition.pool_scores` scores
  the pool with :mod:`boute.optimize.acquisition.functions`.
* Initial design: scrambled Sobol points (``n_init`` evaluated ones), deterministic in the seed; every ask
  is a function of the trials so far, the batch in flight among them as pending trials (BoTorch's
  ``X_pending``), and of the last fit's hyperparameters (the GP's warm start): a search that resumes fits
  afresh, so it keeps every stored trial but may propose otherwise than the interrupted one would have.
* **Objectives** (:mod:`boute.optimize.objectives`). ``latency``: the above. ``cost``: $/h is exact too (a
  function of the deployment), so the acquisition is BoTorch's constrained qLogEI on ``-$/h`` with the
  outcome constraint ``P95 <= cap`` on the latency GP: the improvement in cost weighted by the GP's
  probability of meeting the cap (feasibility-weighted EI). ``pareto``: qLogNEHVI on (exact quality, GP
  ``-log P95``, exact ``-$/h``) with the reference point at the targets (floor, cap, budget). Both also
  centre on the cheaper plan that misses the targets least (:func:`.centres.near_miss`), and ``cost``
  keeps spent deployments out of the pool (:func:`.centres.spent_deployments`). Which evaluated plans the
  pool is built around is :mod:`boute.optimize.strategies.centres`.
* **The batch in flight** (:mod:`boute.optimize.loop`: step k+1 is proposed while step k is evaluated): its
  plans stay out of the pool, the acquisitions take them as ``X_pending``, and its first pick (the one the
  last acquisition ranked highest) is a centre searched as closely as the incumbent (``look_ahead``). Why:
  improvements come in chains of single changes, each made around the plan the last one found; proposed
  before the last results are in, every other step would search around the old incumbent again. On the
  480-GPU fleet (60 evaluations, seeds 0 and 1) the pipelined search ended at P95 4.46 / 4.53 s without the
  look-ahead, 3.59 / 3.55 s with it, and 3.38 / 3.68 s with each step seeing every result before it.
* **Screens** (:mod:`boute.optimize.screen`, via ``use_screen``): the pool holds only plans whose routing
  meets the floor and whose tiers can carry their load, so no acquisition is spent on known failures.
* **A cheaper evaluator as the prior** (``prior``, used when a confirmation's search goes on with the
  simulator, :mod:`boute.optimize.confirm`; :mod:`boute.optimize.surrogates.prior`): the GP then models only the *discrepancy* between the trials'
  ``-log P95`` and the cheaper evaluator's for the same plans (milliseconds each), and the acquisitions see
  cheaper-evaluator prediction + GP residual as one outcome (a sum of a deterministic model and the GP inside
  BoTorch's MC acquisitions). A handful of faithful results then corrects the fast path everywhere instead of
  being the GP's only knowledge of the space.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from boute.optimize.acquisition.pool import Pool, build_pool
from boute.optimize.acquisition.pool_scores import PoolScores
from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import Evaluator
from boute.optimize.objectives import Objective, front_layers
from boute.optimize.screen import Screen
from boute.optimize.space import Candidate, Space
from boute.optimize.status import TrialStatus
from boute.optimize.strategies.base import Strategy
from boute.optimize.strategies.centres import floor_incumbents, front_incumbents, near_miss, spent_deployments
from boute.optimize.strategies.design import SobolDesign
from boute.optimize.surrogates.exact import ExactQuality, QualityFn, exact_quality_fn
from boute.optimize.surrogates.latency import LatencyGP, latency_outcome
from boute.optimize.surrogates.prior import PriorLatency, SoonMany
from boute.optimize.trials import Trial, figures
from boute.specs.targets import meets_floor

if TYPE_CHECKING:
    from botorch.models.model import Model

ACQS = ("hybrid", "ehvi", "ei")
#: qLogNEHVI's noisy baseline: the evaluated plans on the first non-dominated layers of the observed outcomes,
#: at least this many (:func:`boute.optimize.objectives.front_layers`); BoTorch's own pruning then runs on
#: those few instead of on every trial (its cost grows with the trials and had come to dominate a step)
NEHVI_BASELINE = 32


class _GPOptions(TypedDict):
    """What :class:`MoboStrategy` passes on to the GP-quality fallback (:mod:`.mobo_gp`)."""

    num_restarts: int
    raw_samples: int
    mc_samples: int
    acq_optimizer: str
    threads: int


class MoboStrategy(Strategy):
    """``ask(trials)``: Sobol for the first ``n_init`` trials, then the best pool plan by the acquisition."""

    name = "mobo"

    def __init__(
        self,
        space: Space,
        *,
        seed: int = 0,
        n_init: int | None = None,
        num_restarts: int = 2,
        raw_samples: int = 64,
        mc_samples: int = 32,
        acq_optimizer: str = "pool",
        threads: int = 1,
        refit_growth: float = 0.1,
        acq: str = "hybrid",
        kernel: str = "matern",
        pool_global: int = 256,
        pool_local: int = 384,
        clip_factor: float = 3.0,
        fit_maxiter: int = 60,
        warm_maxiter: int = 20,
        quality_fn: QualityFn | None = None,
        objective: Objective | str = "latency",
        prior: Callable[[Candidate], float] | None = None,
        look_ahead: bool = True,
    ) -> None:
        """``num_restarts``/``raw_samples``/``acq_optimizer`` only apply to the GP-quality fallback."""
        if acq not in ACQS:
            raise ValueError(f"acq must be one of {ACQS}, got {acq!r}")
        self.space = space
        self.seed = seed
        self.n_init = n_init if n_init is not None else max(8, min(space.dim, 12))
        self.mc_samples = mc_samples
        self.threads = threads
        self.acq = acq
        self.pool_global = pool_global
        self.pool_local = pool_local
        self.clip_factor = clip_factor
        self.look_ahead = look_ahead
        self.quality_fn = quality_fn
        self.objective = objective if isinstance(objective, Objective) else Objective(objective)
        self.screen: Screen | None = None
        self.latency_gp = LatencyGP(space, kernel, refit_growth, fit_maxiter, warm_maxiter)
        # a cheaper evaluator's P95 (Candidate -> s) as the GP's known mean (module doc)
        self.prior = None if prior is None else PriorLatency(prior, space, clip_factor)
        self._fallback_opts = _GPOptions(
            num_restarts=num_restarts,
            raw_samples=raw_samples,
            mc_samples=mc_samples,
            acq_optimizer="relaxed" if acq_optimizer == "pool" else acq_optimizer,
            threads=threads,
        )
        self._gp_design: Strategy | None = None
        self._design = SobolDesign(space.dim, seed, self.n_init)
        self._exact: ExactQuality | None = None
        self.clock = SearchClock()  # the loop's, once it hands it over (use_clock)
        self.steps: list[str] = []  # the acquisition of each BO step (ei | ehvi | cost | pareto), in order

    # ---- wiring ---------------------------------------------------------------------------------
    def use_screen(self, screen: Screen) -> None:
        """Screen the acquisition pool as the harness screens proposals (``run_search`` calls this)."""
        self.screen = screen

    def use_clock(self, clock: SearchClock) -> None:
        """Time each step's GP fit, pool (with its prior) and acquisition as sub-phases of ``propose`` (the GP
        design's too, when it answers instead)."""
        self.clock = clock
        if self._gp_design is not None:
            self._gp_design.use_clock(clock)

    def use_prior_many(self, p95_soon: SoonMany) -> None:
        """Score each pool's new plans by the prior through ``p95_soon`` (:meth:`PriorLatency.use_many`), handed
        over in parts as the pool is built (:meth:`PriorLatency.prefetch`)."""
        if self.prior is not None:
            self.prior.use_many(p95_soon)

    def bind(self, evaluator: Evaluator) -> None:
        """Take the exact quality function from the evaluator (``run_search`` calls this)."""
        if self.quality_fn is None:
            self.quality_fn = exact_quality_fn(evaluator)

    def _quality(self, fractions: tuple[float, ...]) -> float:
        if self._exact is None:
            assert self.quality_fn is not None
            self._exact = ExactQuality(self.quality_fn)
        return self._exact(fractions)

    # ---- asking -----------------------------------------------------------------------------------
    def ask(self, trials: Sequence[Trial]) -> np.ndarray:
        x0 = self._design.ask(trials)
        if x0 is not None:
            return x0
        if self.quality_fn is None:
            if self._gp_design is None:
                from boute.optimize.strategies.mobo_gp import GPMoboStrategy

                fallback = GPMoboStrategy(
                    self.space, seed=self.seed, n_init=self.n_init, objective=self.objective, **self._fallback_opts
                )
                fallback.use_clock(self.clock)
                self._gp_design, self.steps = fallback, fallback.steps
            return self._gp_design.ask(trials)
        pool, scores = self._bo_step(trials, [t for t in trials if t.ok])
        if pool is None:
            return scores  # nothing new near the incumbents: a fresh uniform point
        return pool.z[int(np.argmax(scores))]

    def ask_batch(self, trials: Sequence[Trial], q: int) -> list[np.ndarray]:
        """``q`` proposals from one model fit: the best pool plans by the acquisition, one per deployment.

        Why one per deployment: the acquisition is smooth in the routing fractions, so its top points are
        mostly the best deployment with its routing nudged; a batch of those would spend ``q`` evaluations
        on what one tells. Taking the best-scoring plan of each of the ``q`` best deployments spreads the
        batch over the plans the acquisition ranks highest (a simple local penalisation). The batch in flight
        is in ``trials`` as :attr:`TrialStatus.PENDING` trials (:mod:`boute.optimize.loop`): the pool leaves
        their plans out and the acquisition takes them as ``X_pending``. The design phase returns its next
        Sobol points. A batch is a function of ``trials`` and of the last fit's hyperparameters (the warm start).
        """
        if self._design.ask(trials) is not None:  # the design's next points (each counts as it is evaluated)
            return self._design.points(trials, q)
        if q <= 1 or self.quality_fn is None:
            return [self.ask(trials)]
        pool, scores = self._bo_step(trials, [t for t in trials if t.ok])
        if pool is None:
            return [scores]
        picked: list[np.ndarray] = []
        seen: set[str] = set()
        for i in np.argsort(-scores, kind="stable"):
            if not np.isfinite(scores[i]) and picked:
                break
            dep = pool.candidates[int(i)].deployment_key()
            if dep in seen:
                continue
            seen.add(dep)
            picked.append(pool.z[int(i)])
            if len(picked) == q:
                break
        return picked

    # ---- one BO step ----------------------------------------------------------------------------
    def _kind(self, step: int, any_feasible: bool) -> str:
        if self.objective.name != "latency":
            # until some plan meets the targets, every objective first looks for one (LogEI towards the cap)
            return self.objective.name if any_feasible else "ei"
        if self.acq != "hybrid":
            return self.acq
        if not any_feasible:
            return "ei"  # first find a plan meeting both targets
        return "ehvi" if step % 3 == 2 else "ei"

    def _bo_step(self, trials: Sequence[Trial], ok: Sequence[Trial]) -> tuple[Pool | None, np.ndarray]:
        """Fit the model and score a fresh pool: ``(pool, log-scores)``, or ``(None, uniform point)`` when
        every plan near the incumbents was evaluated."""
        import torch

        torch.set_num_threads(self.threads)
        goal = self.space.scenario.goal
        floor, cap = goal.quality_floor, goal.p95_cap_s
        budget = self.space.budget
        step = sum(t.evaluated for t in trials) - self.n_init
        rng = np.random.default_rng([self.seed, len(trials), 11])
        torch.manual_seed(self.seed * 100003 + len(trials))

        t0 = time.perf_counter()
        X = torch.tensor(np.array([t.z for t in ok]), dtype=torch.double)
        _, q, p, c = figures(ok)
        y = latency_outcome(p, cap, self.clip_factor)
        y_fit = y if self.prior is None else y - np.array([self.prior.y(t.candidate) for t in ok])
        gp = self.latency_gp.fit(X, torch.tensor(y_fit, dtype=torch.double).unsqueeze(-1))
        t1 = time.perf_counter()

        feas = goal.mask(q, p, c)
        kind = self._kind(step, bool(feas.any()))
        exhaustive, spent = 1, set[str]()
        if self.objective.name == "latency" or not feas.any():
            idx = floor_incumbents(q, p, floor, front=kind == "ehvi")
        else:
            idx = front_incumbents(q, p, c, feas, goal, self.objective)
            deps = [t.candidate.deployment_key() for t in ok]
            if kind == "cost":
                spent = spent_deployments(deps, feas)
            near = near_miss(deps, q, p, c, feas, spent, goal, self.clip_factor * cap)
            if near is not None:  # searched as closely as the incumbent (its doc)
                idx.insert(1, near)
                exhaustive = 2
        centres = [np.asarray(ok[i].z, dtype=float) for i in idx]
        pending = [t.z for t in trials if t.status == TrialStatus.PENDING]  # the batch in flight (X_pending)
        Xp = torch.tensor(np.array(pending), dtype=torch.double) if pending else None
        if pending and self.look_ahead:  # the batch in flight's first pick, searched as closely as the incumbent
            centres.insert(1, np.asarray(pending[0], dtype=float))
            exhaustive += 1
        pool = build_pool(
            self.space,
            centres,
            (t.candidate.key() for t in trials),
            rng,
            n_global=self.pool_global,
            n_local=self.pool_local,
            screen=self.screen,
            exhaustive=exhaustive,
            skip_deployments=spent,
            feed=None if self.prior is None else self.prior.prefetch,
        )
        if len(pool.z) == 0:  # everything nearby was evaluated: a fresh uniform point
            return None, rng.random(self.space.dim)
        pq = np.array([self._quality(cd.fractions) for cd in pool.candidates])
        lat = self._lat_models(gp, pool, [*ok, *(t for t in trials if t.status == TrialStatus.PENDING)])
        t2 = time.perf_counter()
        scoring = PoolScores(self.space, pool, lat, pq, floor, cap, Xp, self.mc_samples, self.seed)
        if kind == "cost":
            scores = scoring.log_cei_cost(float(c[feas].min()) if feas.any() else budget + 1.0)
        elif kind == "pareto":
            base = front_layers(np.stack([-q, -y, c], axis=1), NEHVI_BASELINE)
            scores = scoring.log_nehvi(X[torch.as_tensor(base)], self._quality, budget=budget)
        elif kind == "ei" and meets_floor(pq, floor).any():
            scores = scoring.log_ei(float(y[feas].max()) if feas.any() else -math.log(cap))
        else:
            kind = "ehvi"
            base = front_layers(np.stack([-q, -y], axis=1), NEHVI_BASELINE)
            scores = scoring.log_nehvi(X[torch.as_tensor(base)], self._quality)
        self.clock.add("propose.fit", t1 - t0)
        self.clock.add("propose.pool", t2 - t1)
        self.clock.add("propose.acquisition", time.perf_counter() - t2)
        self.steps.append(kind)
        return pool, np.asarray(scores, dtype=float)

    # ---- the latency outcome: the GP, or a cheaper evaluator's figure plus the GP's residual ------------
    def _lat_models(self, gp: Model, pool: Pool, known: Sequence[Trial]) -> list[Model]:
        """Models whose outputs add up to ``-log P95``: ``[gp]``, or ``[prior, gp]`` with a prior (module doc);
        ``known``: the trials whose plans the acquisition also asks about (the baseline, the pending ones)."""
        if self.prior is None:
            return [gp]
        z = [*pool.z, *(t.z for t in known)]
        cands = [*pool.candidates, *(t.candidate for t in known)]
        return [self.prior.model(z, cands), gp]
