"""Optuna's TPE in the same harness (strategy ``tpe``): the library optimiser the bench compares MOBO with.

TPE (Bergstra et al. 2011; Watanabe 2023) models ``p(x | good)`` and ``p(x | bad)`` with Parzen estimators over
the trials split at the ``gamma`` quantile of the objective and proposes the candidate maximising their ratio
(the expected improvement under that model). Constraints follow c-TPE (Watanabe & Hutter 2023): a trial that
violates one is ranked below every feasible one, by its total violation.

Mapped onto a search of :mod:`boute.optimize.loop`:

* parameters: the unit box of :class:`~boute.optimize.space.Space`, one float per dimension, ``multivariate``
  (one joint estimator: routing and placement interact);
* objective: ``log P95`` (``latency``), ``$/h`` (``cost``) or ``(-quality, log P95, $/h)`` (``pareto``,
  multi-objective TPE), as NSGA-II is told;
* constraints: ``floor - quality <= 0`` and ``log P95 - log cap <= 0``; the budget, inventory and fit are
  built into the space. A failed or screened trial is told as overloaded (P95 of
  :data:`~boute.optimize.evaluators.base.OVERLOAD_P95_S`, quality 0): it exists, and is bad.
* start-up: Optuna's ``n_startup_trials`` uniform points, and more of them for as long as no trial has been
  evaluated. Trials the screens removed are all told the same outcome, so a TPE fitted to them alone has no
  good group to sample around: it asks near screened points and is screened again. On a scenario whose
  capacity screen admits 8% of the box (``mtbench-f81``), the 10 start-up points all miss with probability
  0.92^10 = 43%; seed 2 then asked 1,000 screened points in a row and the search ended with no evaluation.

Stateless over history, like every strategy here: each ask builds an in-memory study from the trials so far
(the point each one asked for and its outcome) with a sampler seeded by ``(seed, len(trials))``, so a resumed
search asks exactly what the interrupted one would have. The batch in flight (:attr:`TrialStatus.PENDING`
trials) joins the study as running trials. A batch is ``q`` asks of that study, the constant liar keeping
them apart from each other and from the running ones. Optuna is imported on first use only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from boute.errors import BouteError
from boute.optimize.evaluators.base import OVERLOAD_P95_S
from boute.optimize.objectives import Objective
from boute.optimize.space import Space
from boute.optimize.status import TrialStatus
from boute.optimize.strategies.base import Strategy
from boute.optimize.trials import Trial

if TYPE_CHECKING:
    import optuna


def _optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:  # pragma: no cover - optuna is a dependency; a trimmed install may lack it
        raise BouteError("--strategy tpe: needs the optuna package (pip install optuna)") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class TPEStrategy(Strategy):
    """Optuna's (multivariate, constrained) TPE sampler over the plan space (module doc)."""

    name = "tpe"

    def __init__(
        self, space: Space, *, seed: int = 0, objective: Objective | str = "latency", n_startup: int = 10
    ) -> None:
        self.space = space
        self.seed = seed
        self._objective = objective.name if isinstance(objective, Objective) else objective
        tg = space.scenario.goal
        self._floor, self._log_cap = tg.quality_floor, math.log(tg.p95_cap_s)
        self._n_startup = n_startup
        self._names = [f"x{i}" for i in range(space.dim)]

    def _outcome(self, t: Trial) -> tuple[list[float], dict[str, float]]:
        if t.ok:
            q, p = t.checked_result.quality, t.checked_result.p95_latency_s
        else:  # failed or screened: overloaded, and below the floor
            q, p = 0.0, OVERLOAD_P95_S
        lp = math.log(max(p, 1e-6))
        c = t.candidate.cost_per_hour
        values = {"latency": [lp], "cost": [c], "pareto": [-q, lp, c]}[self._objective]
        return values, {"quality": self._floor - q, "p95": lp - self._log_cap}

    def _n_startup_now(self, trials: Sequence[Trial]) -> int:
        """Start-up points to ask before TPE models the trials (module doc): ``n_startup``, or every ask while
        nothing has been evaluated past it."""
        if len(trials) < self._n_startup or any(t.evaluated and t.status != TrialStatus.PENDING for t in trials):
            return self._n_startup
        return 2**31 - 1

    def _study(self, trials: Sequence[Trial]) -> optuna.Study:
        optuna = _optuna()
        sampler = optuna.samplers.TPESampler(
            seed=int(np.random.default_rng([self.seed, len(trials)]).integers(2**31)),
            multivariate=True,
            n_startup_trials=self._n_startup_now(trials),
            constant_liar=True,
        )
        directions = ["minimize"] * (3 if self._objective == "pareto" else 1)
        study = optuna.create_study(directions=directions, sampler=sampler)
        dist = optuna.distributions.FloatDistribution(0.0, 1.0)
        dists = dict.fromkeys(self._names, dist)
        for t in trials:
            params = {n: float(min(1.0, max(0.0, v))) for n, v in zip(self._names, t.x, strict=True)}
            if t.status == TrialStatus.PENDING:  # in flight: a running trial, which the constant liar keeps apart
                running = optuna.trial.TrialState.RUNNING
                study.add_trial(optuna.trial.create_trial(state=running, params=params, distributions=dists))
                continue
            values, constraints = self._outcome(t)
            study.add_trial(
                optuna.trial.create_trial(values=values, params=params, distributions=dists, constraints=constraints)
            )
        return study

    def ask(self, trials: Sequence[Trial]) -> np.ndarray:
        return self.ask_batch(trials, 1)[0]

    def ask_batch(self, trials: Sequence[Trial], q: int) -> list[np.ndarray]:
        """``q`` asks of one study built from ``trials`` (the constant liar spreads the pending ones)."""
        study = self._study(trials)
        dist = _optuna().distributions.FloatDistribution(0.0, 1.0)
        out = []
        for _ in range(max(1, q)):
            trial = study.ask(dict.fromkeys(self._names, dist))
            out.append(np.array([trial.params[n] for n in self._names], dtype=float))
        return out
