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
from boute.quality.policy import PolicyResult, QualityModel
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

    @property
    def quality_se(self) -> float:
        """Standard error of a sampled quality (the live evaluator's); 0 for the exact quality model."""
        return float((self.extra or {}).get("quality_stderr") or 0.0)

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
    """What every evaluator offers the search.

    ``fidelity`` ranks evaluators by faithfulness (fast 0 < sim 1 < live 2): a confirmation only ever
    moves up. ``quality_model`` is the exact quality model the evaluator scores routing with, or None when
    quality is measured (sampled); the MOBO strategy uses it as an exact objective instead of a GP.
    ``close`` releases what the evaluator runs (processes, fleets); it is idempotent. The attributes are
    read-only here (properties), so an evaluator may narrow them, e.g. an exact ``quality_model`` that is
    never None.
    """

    @property
    def name(self) -> str: ...

    @property
    def fidelity(self) -> int: ...

    @property
    def mode(self) -> str: ...

    @property
    def quality_model(self) -> QualityModel | None: ...

    def __call__(self, cand: Candidate) -> EvalResult: ...

    def close(self) -> None: ...


def _finite_p95(p95: float) -> float:
    return OVERLOAD_P95_S if not math.isfinite(p95) else float(min(p95, OVERLOAD_P95_S))


def candidate_plan(
    scenario: Scenario,
    cand: Candidate,
    mode: str = "preroute",
    thresholds: tuple[float, ...] | list[float] | None = None,
    router: str | None = None,
) -> Plan:
    """The plan for a candidate; ``router``: the learned router file whose scores split the load (the quality
    model's, ``quality_model.info["router_path"]``). Tiers with zero load and no replicas stay in routing."""
    routing = Routing(
        mode=mode,
        tiers=[t.name for t in scenario.tiers],
        fractions=list(cand.fractions),
        thresholds=None if thresholds is None else [float(v) for v in thresholds],
        scorer="learned" if router else None,
        router=router,
        reference=scenario.quality.profile if router else None,
    )
    return Plan(scenario=scenario.reference, routing=routing, deployment=list(cand.deployment))


def router_of(model: QualityModel | None) -> str | None:
    """The learned router file a quality model routes with (None for a model without one)."""
    return None if model is None else model.info.get("router_path")


def policy_of(model: QualityModel, mode: str, fractions: tuple[float, ...]) -> PolicyResult:
    """The routing policy's quality and per-tier load for ``fractions`` in ``mode``."""
    fn = model.cascade if mode == "cascade" else model.preroute
    return fn(np.asarray(fractions, dtype=float))


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
        **_other_evaluators_options: Any,
    ) -> None:
        from boute.quality import quality_model_for
        from boute.workload import build_workload, workload_stats

        self.scenario = scenario
        self.mode = mode
        self.quality_model: QualityModel = quality_model or quality_model_for(scenario)
        self.stats = workload_stats(build_workload(scenario))

    def __call__(self, cand: Candidate) -> EvalResult:
        from boute.sim import fast_evaluate

        t0 = time.perf_counter()
        pol = policy_of(self.quality_model, self.mode, cand.fractions)
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
            feasible=bool(res.stable) and self.scenario.goal.met_by(q, p95, float(res.cost_per_hour)),
            wall_s=time.perf_counter() - t0,
            evaluator=self.name,
            p50_latency_s=float(res.p50_latency_s) if res.stable else None,
            mean_latency_s=float(res.mean_latency_s) if res.stable else None,
            capacity_rps=float(res.capacity_rps),
            thresholds=tuple(float(v) for v in np.asarray(pol.thresholds).reshape(-1)),
            extra={
                "tier_shares": [float(v) for v in np.asarray(pol.shares).reshape(-1)],
                "quality": pol.summary(),
                "stable": bool(res.stable),
                "utilisation": [float(u) for u in np.asarray(res.utilisation).reshape(-1)],
            },
        )

    def close(self) -> None:
        """Nothing to release: the fast path runs in this process."""


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
        **_other_evaluators_options: Any,
    ) -> None:
        from boute.quality import quality_model_for
        from boute.workload import build_workload

        self.scenario = scenario
        self.mode = mode
        self.seed = seed
        self.quality_model: QualityModel = quality_model or quality_model_for(scenario)
        self.workload = build_workload(scenario)

    def __call__(self, cand: Candidate) -> EvalResult:
        from boute.sim import simulate

        t0 = time.perf_counter()
        pol = policy_of(self.quality_model, self.mode, cand.fractions)
        route = self.quality_model.assign(
            self.workload.prompt_index, np.asarray(cand.fractions), mode=self.mode, seed=self.seed
        )
        plan = candidate_plan(self.scenario, cand, self.mode, router=router_of(self.quality_model))
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
            feasible=self.scenario.goal.met_by(q, p95, cost),
            wall_s=time.perf_counter() - t0,
            evaluator=self.name,
            p50_latency_s=float(summary["p50_latency_s"]),
            mean_latency_s=float(summary["mean_latency_s"]),
            thresholds=tuple(float(v) for v in np.asarray(pol.thresholds).reshape(-1)),
            extra={
                "tier_shares": [float(v) for v in np.asarray(pol.shares).reshape(-1)],
                "quality": pol.summary(),
                "completed": completed,
                "requests": n,
                "slo_attainment": float(summary.get("slo_attainment", math.nan)),
            },
        )

    def close(self) -> None:
        """Nothing to release: the simulator runs in this process."""


def make_evaluator(
    name: str,
    scenario: Scenario,
    mode: str = "preroute",
    seed: int = 0,
    *,
    quality_model: QualityModel | None = None,
    **options: Any,
) -> Evaluator:
    """The registered evaluator called ``name``; ``options`` go to it (e.g. the live one's ``redis_url``)."""
    from boute.optimize.registry import EVALUATORS

    factory = EVALUATORS.get(name).load()
    return factory(scenario, mode, seed=seed, quality_model=quality_model, **options)
