"""A small synthetic evaluator for optimiser tests (no quality model / simulator needed).

Quality is concave in the large-tier share; P95 is an M/M/1-style ``base / (1 - rho)`` per tier with each
replica's service rate from the real roofline perf model (decode-bound tokens/s), so the optimum depends
on routing, GPU choice and TP together, as in the real problem. It is a test double for the *evaluator*
only: the space, strategies, tracking and CLI under test are the real ones.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from boute.optimize.evaluators import OVERLOAD_P95_S, EvalResult
from boute.optimize.space import Candidate
from boute.perf import replica_perf, scenario_catalog
from boute.quality.policy_quality import PolicyResult
from boute.specs import Scenario


class SyntheticQuality:
    """An exact quality model (the part of ``QualityModel`` the optimiser uses): concave in large-tier share."""

    def __init__(self, tier_quality: np.ndarray) -> None:
        self.tier_quality = tier_quality

    def preroute(self, fractions: np.ndarray) -> PolicyResult:
        fr = np.asarray(fractions, dtype=float)
        # a router sends the hardest queries up: the first share of large-tier load buys the most quality
        lift = np.sqrt(np.clip(np.cumsum(fr[::-1])[::-1][1:], 0, 1))
        q = float(self.tier_quality[0] + np.sum(np.diff(self.tier_quality) * lift))
        return PolicyResult(q, fr, fr, 0.0, np.zeros(len(fr) - 1))


class SyntheticEvaluator:
    name = "synthetic"
    fidelity = 0
    mode = "preroute"
    workload = None  # it judges no request stream: its latency is a formula of the plan

    def __init__(
        self,
        scenario: Scenario,
        tier_quality: tuple[float, ...] | None = None,
        delay_s: float = 0.0,
        load: float = 0.6,
    ) -> None:
        """``load``: share of the scenario's rate offered (the M/M/1 stand-in queues harder than the fast
        path, so at the full rate the feasible region is a sliver that any perf-model change can close)."""
        self.scenario = scenario
        self.load = load
        n = len(scenario.tiers)
        self.tier_quality = np.asarray(tier_quality or np.linspace(0.6, 0.9, n))
        self.quality_model = SyntheticQuality(self.tier_quality)
        self.delay_s = delay_s
        self.calls = 0

    def quality(self, fractions: tuple[float, ...]) -> float:
        return self.quality_model.preroute(np.asarray(fractions)).quality

    def close(self) -> None:
        pass

    def __call__(self, cand: Candidate) -> EvalResult:
        self.calls += 1
        t0 = time.perf_counter()
        if self.delay_s:
            time.sleep(self.delay_s)
        cat = scenario_catalog(self.scenario)
        rate = self.scenario.workload.rate_rps * self.load
        p95 = 0.0
        cap_total = 0.0
        for ti, tier in enumerate(self.scenario.tiers):
            f = cand.fractions[ti]
            groups = [g for g in cand.deployment if g.tier == tier.name]
            if f <= 0:
                continue
            mu, base = 0.0, math.inf
            for g in groups:
                perf = replica_perf(cat.model(g.model), cat.gpu(g.gpu), g.tp, g.pp, g.dtype)
                batch = max(1, min(64, perf.max_batch(300, 150)))
                step = float(perf.decode_step_time(batch, batch * 375))
                mu += g.count * batch / (150 * step)  # requests/s at full batch
                base = min(base, float(perf.prefill_time(300)) + 150 * float(perf.decode_step_time(1, 375)))
            rho = f * rate / mu if mu > 0 else math.inf
            cap_total += mu
            tier_p95 = base * (1.0 + 2.0 * rho / (1 - rho)) if rho < 1 else OVERLOAD_P95_S
            p95 = max(p95, tier_p95)
        p95 = min(p95, OVERLOAD_P95_S)
        q = self.quality(cand.fractions)
        return EvalResult(
            quality=q,
            p95_latency_s=p95,
            throughput_rps=min(rate, cap_total),
            cost_per_hour=cand.cost_per_hour,
            feasible=self.scenario.goal.met_by(q, p95, cand.cost_per_hour),
            wall_s=time.perf_counter() - t0,
            evaluator=self.name,
        )


class SkewedEvaluator(SyntheticEvaluator):
    """The synthetic evaluator with every P95 multiplied by ``skew``, under its own name and fidelity.

    A pair of them plays a search evaluator and a confirming one that disagree (issue 13: the fast path put a
    plan at 3.17 s that the simulator put at 38.5 s): ``skew < 1`` is a search evaluator that is optimistic
    everywhere, ``skew = 1`` the truth, a huge ``skew`` a confirming evaluator that rejects every plan.
    """

    def __init__(self, scenario: Scenario, name: str, fidelity: int, skew: float, **kw: object) -> None:
        super().__init__(scenario, **kw)  # type: ignore[arg-type]
        self.name, self.fidelity, self.skew = name, fidelity, skew

    def __call__(self, cand: Candidate) -> EvalResult:
        r = super().__call__(cand)
        p95 = min(OVERLOAD_P95_S, r.p95_latency_s * self.skew)
        feasible = self.scenario.goal.met_by(r.quality, p95, r.cost_per_hour)
        return replace(r, p95_latency_s=p95, feasible=feasible, evaluator=self.name)


def optimistic_evaluator(scenario: Scenario, mode: str = "preroute", **_: object) -> SkewedEvaluator:
    """Registry factory: a search evaluator (fidelity 0) reporting a fifth of the true P95."""
    return SkewedEvaluator(scenario, "skew-fast", 0, 0.2)


def rejecting_evaluator(scenario: Scenario, mode: str = "preroute", **_: object) -> SkewedEvaluator:
    """Registry factory: a confirming evaluator (fidelity 1) whose P95 is beyond every cap."""
    return SkewedEvaluator(scenario, "skew-strict", 1, 1e4)
