"""Evaluators of a candidate plan, of rising cost and truth, behind one interface.

``fast``: quality from the quality model's policy quality + P95/throughput from the analytical queueing
fast path (milliseconds). ``sim``: the same quality, P95/throughput from the discrete-event simulator on
the scenario's workload, with each request routed by the quality model's learned router (seconds). Both
are approximate: they inherit the performance model's error (a calibrated roofline).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from boute.optimize.space import Candidate
from boute.specs import Plan, Routing, Scenario

#: latency reported for an overloaded (unstable) plan: far above any cap, finite so the GP can model it
OVERLOAD_P95_S = 3600.0
#: the fast path's P95 for an overloaded plan: this many times the cap, times the worst utilisation
OVERLOAD_FACTOR = 4.0


@dataclass(frozen=True)
class EvalResult:
    quality: float
    p95_latency_s: float
    throughput_rps: float
    cost_per_hour: float
    feasible: bool
    wall_s: float
    evaluator: str
    p50_latency_s: float | None = None
    mean_latency_s: float | None = None
    capacity_rps: float | None = None
    thresholds: tuple[float, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["thresholds"] = list(self.thresholds) if self.thresholds is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EvalResult:
        d = dict(d)
        if d.get("thresholds") is not None:
            d["thresholds"] = tuple(d["thresholds"])
        return cls(**d)


class Evaluator(Protocol):
    name: str

    def __call__(self, cand: Candidate) -> EvalResult: ...


#: an evaluator that measures quality on a sample (the live one: one or two hundred answers, standard error
#: ~0.03-0.04) reports that standard error; such a plan meets the floor when the floor is within this many
#: standard errors of its measured mean, not only when the sample mean is above it
QUALITY_SE_TOLERANCE = 2.0


def quality_for_targets(r: EvalResult) -> float:
    """The quality compared with the floor: the result's, plus the sampling tolerance where it was sampled."""
    se = float((r.extra or {}).get("quality_stderr") or 0.0)
    return r.quality + QUALITY_SE_TOLERANCE * se


def meets(scenario: Scenario, quality: float, p95: float, cost: float) -> bool:
    t = scenario.targets
    return (
        quality >= t.quality_floor - 1e-12
        and p95 <= t.p95_latency_s
        and cost <= scenario.cluster.budget_per_hour + 1e-6
    )


def _finite_p95(p95: float) -> float:
    return OVERLOAD_P95_S if not math.isfinite(p95) else float(min(p95, OVERLOAD_P95_S))


def candidate_plan(scenario: Scenario, cand: Candidate, mode: str = "preroute", thresholds=None) -> Plan:  # noqa: ANN001
    """The plan file for a candidate (tiers with zero load and no replicas are kept in routing)."""
    routing = Routing(
        mode=mode,  # type: ignore[arg-type]
        tiers=[t.name for t in scenario.tiers],
        fractions=list(cand.fractions),
        thresholds=None if thresholds is None else [float(v) for v in thresholds],
        router=scenario.quality.router,
    )
    return Plan(scenario=scenario.reference, routing=routing, deployment=list(cand.deployment))


class _QualitySide:
    """Lazily built quality model shared by both evaluators (training the router is the costly part)."""

    def __init__(self, scenario: Scenario, mode: str) -> None:
        from boute.quality import quality_model_for

        self.model = quality_model_for(scenario)
        self.mode = mode

    def policy(self, fractions: tuple[float, ...]):  # noqa: ANN201 - PolicyResult
        fn = self.model.cascade if self.mode == "cascade" else self.model.preroute
        return fn(np.asarray(fractions, dtype=float))


class FastEvaluator:
    """Quality model + analytical fast path (``boute.sim.fast_evaluate``)."""

    name = "fast"

    def __init__(self, scenario: Scenario, mode: str = "preroute", quality: _QualitySide | None = None) -> None:
        from boute.workload import build_workload, workload_stats

        self.scenario = scenario
        self.mode = mode
        self.quality = quality or _QualitySide(scenario, mode)
        self.stats = workload_stats(build_workload(scenario))

    def __call__(self, cand: Candidate) -> EvalResult:
        from boute.sim import fast_evaluate

        t0 = time.perf_counter()
        pol = self.quality.policy(cand.fractions)
        tiers = [t.name for t in self.scenario.tiers]
        res = fast_evaluate(
            list(cand.deployment), self.scenario, self.stats, [float(v) for v in pol.visits], tiers, mode=self.mode
        )
        if res.stable:
            p95 = _finite_p95(res.p95_latency_s)
        else:
            # overloaded: the true P95 grows without bound; report a penalty that still says *how* overloaded
            # (so a surrogate can tell nearly-stable plans from hopeless ones), always far above the cap
            util = max([float(u) for u in np.asarray(res.utilisation).reshape(-1)] or [1.0])
            p95 = _finite_p95(OVERLOAD_FACTOR * self.scenario.targets.p95_latency_s * max(1.0, util))
        q = float(pol.quality)
        return EvalResult(
            quality=q,
            p95_latency_s=p95,
            throughput_rps=float(res.throughput_rps),
            cost_per_hour=float(res.cost_per_hour),
            feasible=bool(res.stable) and meets(self.scenario, q, p95, float(res.cost_per_hour)),
            wall_s=time.perf_counter() - t0,
            evaluator=self.name,
            p50_latency_s=float(res.p50_latency_s) if res.stable else None,
            mean_latency_s=float(res.mean_latency_s) if res.stable else None,
            capacity_rps=float(res.capacity_rps),
            thresholds=tuple(float(v) for v in np.asarray(pol.thresholds).reshape(-1)),
            extra={
                "stable": bool(res.stable),
                "utilisation": [float(u) for u in np.asarray(res.utilisation).reshape(-1)],
            },
        )


class SimEvaluator:
    """Quality model + discrete-event simulation of the workload, requests routed by the learned router."""

    name = "sim"

    def __init__(
        self, scenario: Scenario, mode: str = "preroute", quality: _QualitySide | None = None, seed: int = 0
    ) -> None:
        from boute.workload import build_workload

        self.scenario = scenario
        self.mode = mode
        self.seed = seed
        self.quality = quality or _QualitySide(scenario, mode)
        self.workload = build_workload(scenario)

    def __call__(self, cand: Candidate) -> EvalResult:
        from boute.sim import simulate

        t0 = time.perf_counter()
        pol = self.quality.policy(cand.fractions)
        route = self.quality.model.assign(
            self.workload.prompt_index, np.asarray(cand.fractions), mode=self.mode, seed=self.seed
        )
        plan = candidate_plan(self.scenario, cand, self.mode)
        summary = simulate(plan, self.scenario, self.workload, route, seed=self.seed).summary()
        completed = float(summary.get("completed", len(self.workload.arrival_s)))
        n = float(summary.get("requests", len(self.workload.arrival_s)))
        # unfinished requests count as infinitely slow in the simulator's quantiles; below 95% done the
        # P95 itself is infinite and is reported as the overload figure
        p95 = float(summary["p95_latency_s"])
        p95 = _finite_p95(p95)
        q = float(pol.quality)
        cost = float(summary.get("cost_per_hour", cand.cost_per_hour))
        return EvalResult(
            quality=q,
            p95_latency_s=p95,
            throughput_rps=float(summary["throughput_rps"]),
            cost_per_hour=cost,
            feasible=meets(self.scenario, q, p95, cost),
            wall_s=time.perf_counter() - t0,
            evaluator=self.name,
            p50_latency_s=float(summary["p50_latency_s"]),
            mean_latency_s=float(summary["mean_latency_s"]),
            thresholds=tuple(float(v) for v in np.asarray(pol.thresholds).reshape(-1)),
            extra={
                "completed": completed,
                "requests": n,
                "slo_attainment": float(summary.get("slo_attainment", math.nan)),
            },
        )


def make_evaluator(
    name: str, scenario: Scenario, mode: str = "preroute", seed: int = 0, *, redis_url: str | None = None
) -> Evaluator:
    """The evaluator called ``name``; ``redis_url`` is the live evaluator's replica registry (others ignore it)."""
    if name == "fast":
        return FastEvaluator(scenario, mode)
    if name == "sim":
        return SimEvaluator(scenario, mode, seed=seed)
    if name == "live":  # measured on emulated/real backends (the deployment side's evaluator)
        from boute.optimize.live import LiveEvaluator

        return LiveEvaluator(scenario, mode, seed=seed, **({"redis_url": redis_url} if redis_url else {}))
    from boute.errors import BouteError

    raise BouteError(f"--evaluator: unknown evaluator '{name}' (known: fast, sim, live)")
