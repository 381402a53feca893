"""The ``sim`` evaluator: the quality model's policy quality + the discrete-event simulator on the workload.

Each request of the scenario's workload is routed by the quality model's learned router (the same scores
and thresholds the gateway will use) and simulated on the plan's replicas (:func:`boute.sim.simulate`);
seconds a plan. Unfinished requests count as infinitely slow in the simulator's quantiles, so below 95%
done the P95 itself is infinite and is reported as :data:`~boute.optimize.evaluators.base.OVERLOAD_P95_S`.

Every draw is the scenario's: arrivals and lengths come from ``workload.seed``
(:func:`boute.workload.replay_workload`), and so does the tier of each request that carries no profile
prompt (trace or synthetic lengths: long-prompt, the random scenarios), drawn by the routing fractions
(:meth:`~boute.quality.policy_quality.QualityModel.assign`). A plan therefore has one figure per scenario, whatever
the search's ``--seed``: the seed changes where the search looks, never what a plan is promised. (Until
stop 44 the tier draw took the search's seed, and one long-prompt plan was P95 4.86 s under seed 3 and
5.62 s under seed 1, against a 5 s cap.)
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from boute.optimize.evaluators.base import (
    EvalDetail,
    EvalResult,
    candidate_plan,
    finite_or_none,
    finite_p95,
    floats,
    judge_delay_of,
    policy_of,
    router_of,
    scorer_of,
)
from boute.optimize.space import Candidate
from boute.quality.policy_quality import QualityModel
from boute.specs import Scenario
from boute.workload import Workload


def stream_shares(route: np.ndarray, n_tiers: int) -> tuple[float, ...]:
    """The share of the simulated requests each tier answers (``route``: the answering tier of each).

    Why the stream's and not the quality model's held-out shares: the stream is the scenario's own traffic,
    which ``boute verify`` replays, and it can ask the held-out prompts in another mix than one each; a
    conversation opens on a question's first turn and asks its second after it, so the first turns are the
    more frequent over a finite run (MT-Bench conversations over 60 s: 59% against 50% held out, which moved
    the large tier's share by 0.025, more than verify's 0.02 tolerance)."""
    if len(route) == 0:
        return tuple(0.0 for _ in range(n_tiers))
    return floats(np.bincount(np.asarray(route, dtype=np.int64), minlength=n_tiers)[:n_tiers] / len(route))


class SimEvaluator:
    """Quality model + discrete-event simulation of the workload, requests routed by the learned router."""

    name = "sim"
    fidelity = 1

    def __init__(
        self,
        scenario: Scenario,
        mode: str = "preroute",
        quality_model: QualityModel | None = None,
        seed: int = 0,
        workload: Workload | None = None,
        **_other_evaluators_options: Any,
    ) -> None:
        """``seed``: the search's, accepted as every evaluator accepts it and not used (module doc);
        ``workload``: the search's stream, when it has one already (else built: the same one)."""
        from boute.quality import quality_model_for
        from boute.workload import replay_workload

        self.scenario = scenario
        self.mode = mode
        self.seed = scenario.workload.seed  # the draws' seed: the scenario's (module doc)
        self.quality_model: QualityModel = quality_model or quality_model_for(scenario)
        self.workload: Workload = (
            workload if workload is not None else replay_workload(scenario, self.quality_model.test_index)
        )
        self.judge_delay_s = judge_delay_of(self.quality_model)

    def __call__(self, cand: Candidate) -> EvalResult:
        from boute.sim import simulate

        t0 = time.perf_counter()
        pol = policy_of(self.quality_model, self.mode, cand.fractions)
        route = self.quality_model.assign(
            self.workload.prompt_index, np.asarray(cand.fractions), mode=self.mode, seed=self.seed
        )
        plan = candidate_plan(
            self.scenario, cand, self.mode, router=router_of(self.quality_model), scorer=scorer_of(self.quality_model)
        )
        run = simulate(plan, self.scenario, self.workload, route, seed=self.seed, judge_delay_s=self.judge_delay_s)
        summary = run.summary()
        sent = len(self.workload.arrival_s)
        p95 = finite_p95(float(summary["p95_latency_s"]))  # (module doc: an infinite P95 is the overload figure)
        q = float(pol.quality)
        cost = float(summary.get("cost_per_hour", cand.cost_per_hour))
        return EvalResult(
            quality=q,
            p95_latency_s=p95,
            throughput_rps=float(summary["throughput_rps"]),
            cost_per_hour=cost,
            feasible=self.scenario.goal.met_by(q, p95, cost),
            wall_s=time.perf_counter() - t0,
            evaluator=self.name,
            p50_latency_s=float(summary["p50_latency_s"]),
            mean_latency_s=float(summary["mean_latency_s"]),
            thresholds=floats(pol.thresholds),
            prices=floats(pol.prices) if pol.prices is not None else None,
            extra=EvalDetail(
                tier_shares=stream_shares(route, len(self.scenario.tiers)),
                quality=pol.summary(),
                completed=int(summary.get("completed", sent)),
                requests=int(summary.get("requests", sent)),
                slo_attainment=float(summary.get("slo_attainment", math.nan)),
                cached_token_share=summary.get("cached_token_share"),
                ttft_p50_s=finite_or_none(summary["p50_ttft_s"]),
                ttft_p95_s=finite_or_none(summary["p95_ttft_s"]),
            ),
        )

    def close(self) -> None:
        """Nothing to release: the simulator runs in this process."""
