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
from dataclasses import replace
from typing import Any

import numpy as np

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
from boute.sim.expected_hits import ExpectedHits, Holders, miss_grid
from boute.specs import Scenario
from boute.workload import Workload, WorkloadStats

#: routings whose cache holders a fast evaluator keeps (each a few arrays of the stream's segment events)
ROUTINGS_KEPT = 256
#: the step the fractions are rounded to for the expected prefix-cache hits (:meth:`FastEvaluator._holders`)
ROUTING_STEP = 0.01


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
        self.hits = ExpectedHits(w.prefixes, w.input_tokens, len(scenario.tiers)) if w.prefixes is not None else None
        aff = scenario.balancing.affinity
        self.affinity = aff is not None and aff.enabled  # the balancing the plans are judged under
        self._routed: dict[tuple[int, ...], Holders] = {}

    def __call__(self, cand: Candidate) -> EvalResult:
        from boute.sim import fast_evaluate

        t0 = time.perf_counter()
        pol = policy_of(self.quality_model, self.mode, cand.fractions)
        tiers = [t.name for t in self.scenario.tiers]
        tier_stats, cached_share = self._tier_stats(cand)
        res = fast_evaluate(
            list(cand.deployment),
            self.scenario,
            self.stats,
            [float(v) for v in pol.visits],
            tiers,
            mode=self.mode,
            tier_stats=tier_stats,
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
                cached_token_share=cached_share,
            ),
        )

    def _tier_stats(self, cand: Candidate) -> tuple[list[WorkloadStats] | None, float | None]:
        """Each tier's length moments, and the expected share of all prompt tokens served from cache (None
        without prefixes). Each tier's prompts are shortened by the share ``h`` of their tokens the candidate's
        replicas are expected to serve from their prefix caches (:mod:`boute.sim.expected_hits`): a hit skips
        prefill and shares the KV it holds, so the tier prefills ``(1 - h)`` of its prompts (first moment
        ``x (1 - h)``, second ``x (1 - h)^2``). Without prefixes: the stream's own moments."""
        if self.hits is None:
            return self.tier_stats, None
        names = [t.name for t in self.scenario.tiers]
        replicas = [sum(g.count for g in cand.deployment if g.tier == name) for name in names]
        hit, prompt = self.hits.tokens_of(self._holders(cand.fractions), replicas, self.affinity)
        miss = miss_grid(np.divide(hit, prompt, out=np.zeros(len(names)), where=prompt > 0))
        base = self.tier_stats if self.tier_stats is not None else [self.stats] * len(names)
        stats = [
            replace(st, mean_input=st.mean_input * mk, input_sq_mean=st.input_sq_mean * mk**2)
            for st, mk in zip(base, miss, strict=True)
        ]
        return stats, float(hit.sum() / prompt.sum()) if prompt.sum() > 0 else None

    def _holders(self, fractions: tuple[float, ...]) -> Holders:
        """The cache holders (:meth:`ExpectedHits.holders`) of the routing at ``fractions`` rounded to
        :data:`ROUTING_STEP`, memoised: a search's candidate pool asks for thousands of plans, most of them at
        fractions within a step of another's, and a share of hits moves little within a step."""
        key = tuple(round(f / ROUTING_STEP) for f in fractions)
        got = self._routed.get(key)
        if got is None:
            assert self.hits is not None
            near = np.asarray(key, dtype=float) * ROUTING_STEP
            route = self.quality_model.assign(
                self.workload.prompt_index, near / near.sum(), mode=self.mode, seed=self.scenario.workload.seed
            )
            got = self.hits.holders(route, self.mode == "cascade")
            if len(self._routed) >= ROUTINGS_KEPT:
                self._routed.pop(next(iter(self._routed)))
            self._routed[key] = got
        return got

    def close(self) -> None:
        """Nothing to release: the fast path runs in this process."""
