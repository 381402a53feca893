"""The ``fast`` evaluator: the quality model's policy quality + the analytical queueing fast path.

Milliseconds a plan (:func:`boute.sim.fast_evaluate`), so it is what the search's screen and the
simulator-search's prior run on. It inherits the performance model's error (a calibrated roofline) and
the fast path's own (``docs/simulator.md``), which is why a plan is confirmed by the simulator before it
is written. An overloaded plan (some tier unstable) gets the P95 ``OVERLOAD_FACTOR x cap x max
utilisation``: always far above the cap, and still saying *how* overloaded, so a surrogate can tell
nearly-stable plans from hopeless ones.
"""

from __future__ import annotations

import time
from typing import Any

from boute.optimize.evaluators.base import (
    OVERLOAD_FACTOR,
    EvalDetail,
    EvalResult,
    finite_p95,
    floats,
    judge_delay_of,
    policy_of,
)
from boute.optimize.space import Candidate
from boute.quality.policy_quality import QualityModel
from boute.specs import Scenario
from boute.workload import Workload


class FastEvaluator:
    """Quality model + analytical fast path (``boute.sim.fast_evaluate``)."""

    name = "fast"
    fidelity = 0

    def __init__(
        self,
        scenario: Scenario,
        mode: str = "preroute",
        quality_model: QualityModel | None = None,
        seed: int = 0,
        workload: Workload | None = None,
        **_other_evaluators_options: Any,
    ) -> None:
        """``workload``: the search's stream, when it has one already (else built: the simulator's)."""
        from boute.quality import quality_model_for
        from boute.workload import replay_workload, tier_workload_stats, workload_stats

        self.scenario = scenario
        self.mode = mode
        self.quality_model: QualityModel = quality_model or quality_model_for(scenario)
        w = workload if workload is not None else replay_workload(scenario, self.quality_model.test_index)
        self.workload: Workload = w
        self.stats = workload_stats(w)
        # each tier's answers at its own length (every prompt: the split is the candidate's, not known here)
        self.tier_stats = (
            tier_workload_stats(w, None, len(scenario.tiers)) if w.tier_output_tokens is not None else None
        )
        self.judge_delay_s = judge_delay_of(self.quality_model)

    def __call__(self, cand: Candidate) -> EvalResult:
        from boute.sim import fast_evaluate

        t0 = time.perf_counter()
        pol = policy_of(self.quality_model, self.mode, cand.fractions)
        tiers = [t.name for t in self.scenario.tiers]
        res = fast_evaluate(
            list(cand.deployment),
            self.scenario,
            self.stats,
            [float(v) for v in pol.visits],
            tiers,
            mode=self.mode,
            tier_stats=self.tier_stats,
            judge_delay_s=self.judge_delay_s,
        )
        if res.stable:
            p95 = finite_p95(res.p95_latency_s)
        else:  # overloaded (module doc)
            util = max(list(floats(res.utilisation)) or [1.0])
            p95 = finite_p95(OVERLOAD_FACTOR * self.scenario.targets.p95_latency_s * max(1.0, util))
        q = float(pol.quality)
        return EvalResult(
            quality=q,
            p95_latency_s=p95,
            throughput_rps=float(res.throughput_rps),
            cost_per_hour=float(res.cost_per_hour),
            feasible=bool(res.stable) and self.scenario.goal.met_by(q, p95, float(res.cost_per_hour)),
            wall_s=time.perf_counter() - t0,
            evaluator=self.name,
            p50_latency_s=float(res.p50_latency_s) if res.stable else None,
            mean_latency_s=float(res.mean_latency_s) if res.stable else None,
            capacity_rps=float(res.capacity_rps),
            thresholds=floats(pol.thresholds),
            prices=floats(pol.prices) if pol.prices is not None else None,
            extra=EvalDetail(
                tier_shares=floats(pol.shares),
                quality=pol.summary(),
                stable=bool(res.stable),
                utilisation=floats(res.utilisation),
            ),
        )

    def close(self) -> None:
        """Nothing to release: the fast path runs in this process."""
