"""What every evaluator is and returns: the :class:`Evaluator` protocol, :class:`EvalResult` and its typed
:class:`EvalDetail`, and the pieces the evaluators share (the overload figure, a candidate's plan).

Evaluators rise in cost and truth: ``fast`` (analytical queueing, milliseconds), ``sim`` (the discrete-event
simulator, seconds), ``live`` (real deployments, registered by the CLI from ``backends/``). The
``fidelity`` rank orders them (fast 0 < sim 1 < live 2); a confirmation only ever moves up.

Serialised form (the tracking DB's ``metrics`` column): :meth:`EvalResult.to_dict` writes every field under
its own name and the detail under ``"extra"`` as a flat JSON object holding only the fields an evaluator
filled, the format rows have always had, so rows of earlier versions read back and rows written now read
in earlier versions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from boute.optimize.space import Candidate
from boute.quality.policy_quality import PolicyResult, QualityModel
from boute.specs import Plan, Routing, Scenario
from boute.specs.scorers import SCORER_RULES
from boute.workload import Workload

#: latency reported for an overloaded (unstable) plan: far above any cap, finite so the GP can model it
OVERLOAD_P95_S = 3600.0
#: the fast path's P95 for an overloaded plan: this many times the cap, times the worst utilisation
OVERLOAD_FACTOR = 4.0


@dataclass(frozen=True)
class EvalDetail:
    """What an evaluator reports beside the headline figures; each evaluator fills its own fields, the rest
    stay None. Nothing in the search branches on them except :attr:`quality_stderr` (the sampled-quality
    tolerance of :meth:`boute.specs.Targets.mask`) and :attr:`tier_shares` (the written plan's prediction).

    ``tier_shares`` and ``answered_shares`` are one JSON key, ``"tier_shares"``, told apart by their form:
    a list (per tier, in the scenario's tier order) is the quality model's share of its held-out prompts,
    a prediction; an object (tier name -> share) is the share of answers each tier gave in a live replay,
    a measurement.
    """

    # fast and sim: the quality model's per-tier shares of its held-out prompts (a prediction)
    tier_shares: tuple[float, ...] | None = None
    # live: the share of answers each tier gave (a measurement, keyed by tier name)
    answered_shares: Mapping[str, float] | None = None
    # fast and sim: the exact quality model's held-out figures of the plan's routing: mean, standard error,
    # one-sided lower confidence bound and its level (PolicyResult.summary; the plan records them)
    quality: Mapping[str, float | None] | None = None
    # fast: whether every tier's queue is stable, and each replica group's utilisation
    stable: bool | None = None
    utilisation: tuple[float, ...] | None = None
    # sim and live: requests sent; sim: those that completed within the horizon, and the SLO attainment
    requests: int | None = None
    completed: int | None = None
    slo_attainment: float | None = None
    # sim: share of the completed requests' prompt tokens served from the replicas' prefix caches (None: the
    # workload's prompts share no prefixes)
    cached_token_share: float | None = None
    # sim: time to first token, P50 and P95
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    # live: failed requests, the standard error of the sampled quality, the share of answers that were the
    # answering tier's recorded ones, the time compression, and the deploy and replay wall times
    failed: int | None = None
    quality_stderr: float | None = None
    answers_match_profile: float | None = None
    speedup: float | None = None
    deploy_s: float | None = None
    replay_wall_s: float | None = None
    # the search harness: a repeat of a plan already evaluated, answered from its cache (no evaluation)
    cached: bool = False

    def __post_init__(self) -> None:
        if self.tier_shares is not None and self.answered_shares is not None:
            raise ValueError("EvalDetail: tier_shares (predicted) and answered_shares (measured) are exclusive")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored as ``metrics["extra"]``: the fields that are set, tuples as lists."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None or (f.name == "cached" and not v):
                continue
            if f.name == "answered_shares":
                out["tier_shares"] = dict(v)
            elif f.name == "quality":
                out[f.name] = dict(v)
            elif isinstance(v, tuple):
                out[f.name] = list(v)
            else:
                out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> EvalDetail:
        """The detail a stored ``metrics["extra"]`` object describes. Keys no field holds (none of the
        evaluators here ever wrote one) are not kept: nothing reads them."""
        if not d:
            return cls()
        names = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in names and k not in ("tier_shares", "answered_shares")}
        shares = d.get("tier_shares")
        if isinstance(shares, Mapping):
            kw["answered_shares"] = {str(k): float(v) for k, v in shares.items()}
        elif shares is not None:
            kw["tier_shares"] = tuple(float(v) for v in shares)
        if kw.get("utilisation") is not None:
            kw["utilisation"] = tuple(float(v) for v in kw["utilisation"])
        return cls(**kw)


@dataclass(frozen=True)
class EvalResult:
    """One evaluation of one plan: its quality, P95, throughput, $/h and whether it meets the targets."""

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
    extra: EvalDetail = field(default_factory=EvalDetail)
    #: a multi router's prices for the plan's fractions (its cut, as ``thresholds`` are the ladder's)
    prices: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.extra, EvalDetail):  # a stored object is read by from_dict, never passed as is
            raise TypeError(f"EvalResult.extra: expected an EvalDetail, got {type(self.extra).__name__}")

    @property
    def quality_se(self) -> float:
        """Standard error of a sampled quality (the live evaluator's); 0 for the exact quality model."""
        return float(self.extra.quality_stderr or 0.0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["thresholds"] = list(self.thresholds) if self.thresholds is not None else None
        d["extra"] = self.extra.to_dict()
        if self.prices is None:  # rows without prices read as before in earlier versions
            del d["prices"]
        else:
            d["prices"] = list(self.prices)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalResult:
        d = dict(d)
        for k in ("thresholds", "prices"):
            if d.get(k) is not None:
                d[k] = tuple(float(v) for v in d[k])
        d["extra"] = EvalDetail.from_dict(d.get("extra"))
        return cls(**d)


class Evaluator(Protocol):
    """What every evaluator offers the search.

    ``fidelity`` ranks evaluators by faithfulness (fast 0 < sim 1 < live 2): a confirmation only ever
    moves up. ``quality_model`` is the exact quality model the evaluator scores routing with, or None when
    quality is measured (sampled); the MOBO strategy uses it as an exact objective instead of a GP.
    ``mode`` is the routing mode it evaluates (``preroute`` or ``cascade``). ``workload`` is the request
    stream it judges every plan on: built once per search (the exact evaluators: the scenario's arrivals
    carrying the quality model's held-out prompts, :func:`boute.workload.replay_workload`) and handed to
    whatever else must see the same stream (the screen, a prior, a confirming evaluator, the plan's balance
    weights); the live evaluator's is the sample it replays. ``close`` releases what the
    evaluator runs (processes, fleets); it is idempotent. The attributes are read-only here (properties), so
    an evaluator may narrow them, e.g. an exact ``quality_model`` that is never None.
    """

    @property
    def name(self) -> str: ...

    @property
    def fidelity(self) -> int: ...

    @property
    def mode(self) -> str: ...

    @property
    def quality_model(self) -> QualityModel | None: ...

    @property
    def workload(self) -> Workload | None: ...

    def __call__(self, cand: Candidate) -> EvalResult: ...

    def close(self) -> None: ...


def finite_p95(p95: float) -> float:
    """``p95`` capped at :data:`OVERLOAD_P95_S` (an infinite P95, an overloaded plan's, becomes that figure)."""
    return OVERLOAD_P95_S if not math.isfinite(p95) else float(min(p95, OVERLOAD_P95_S))


def finite_or_none(x: float) -> float | None:
    """``x`` where it is a number, None where it is not (an overloaded plan's unfinished requests make its
    percentiles infinite, which a JSON record cannot hold)."""
    return float(x) if math.isfinite(x) else None


def candidate_plan(
    scenario: Scenario,
    cand: Candidate,
    mode: str = "preroute",
    thresholds: tuple[float, ...] | list[float] | None = None,
    router: str | None = None,
    verifier: str | None = None,
    judge_model: str | None = None,
    *,
    scorer: str = "ladder",
    prices: tuple[float, ...] | list[float] | None = None,
) -> Plan:
    """The plan for a candidate. Pre-route: ``router`` is the learned router file whose scores split the load
    (:func:`router_of`), ``scorer`` what it is (``ladder``, cut by ``thresholds``; ``multi``: the multi router,
    cut by ``prices``; :func:`scorer_of`; the cut is the scorer's rule, :data:`boute.specs.scorers.SCORER_RULES`). Cascade: ``verifier`` is the verifier file whose
    scores ``thresholds`` were cut on (:func:`verifier_of`), or ``judge_model`` the LLM judge whose recorded
    scores they were cut on (:func:`llm_judge_of`); the plan names it as its judge (a cascade needs no
    router). Tiers with zero load and no replicas stay in routing."""
    cut = None if thresholds is None else [float(v) for v in thresholds]
    cascade = mode == "cascade"
    llm = cascade and judge_model is not None and cut is not None
    judged = cascade and (verifier is not None or llm) and cut is not None
    routed = not cascade and router is not None
    priced = routed and SCORER_RULES[scorer].cut == "prices"
    routing = Routing(
        mode=mode,
        tiers=[t.name for t in scenario.tiers],
        fractions=list(cand.fractions),
        thresholds=None if priced else cut,
        prices=[float(v) for v in prices] if priced and prices is not None else None,
        scorer=scorer if routed else None,
        router=router if routed else None,
        reference=scenario.quality.profile if routed else None,
        judge=("llm" if llm else "verifier") if judged else None,
        verifier=verifier if judged and not llm else None,
        judge_model=judge_model if llm else None,
    )
    affinity = scenario.balancing.affinity  # the balancing the plan is judged under is the one it carries
    return Plan(scenario=scenario.reference, routing=routing, deployment=list(cand.deployment), affinity=affinity)


def router_of(model: QualityModel | None) -> str | None:
    """The learned router file a quality model routes with (None for a model without one)."""
    return None if model is None else model.info.get("router_path")


def scorer_of(model: QualityModel | None) -> str:
    """The plan's ``routing.scorer`` for a quality model's pre-routing: its router kind (``ladder`` or ``multi``)."""
    return "ladder" if model is None else model.router_kind


def router_files_of(model: QualityModel | None) -> list[Path]:
    """Every file of the router a quality model pre-routes with (weights first): what a plan bundles."""
    if model is None or not model.info.get("router_path"):
        return []
    if "router_files" in model.info:
        return [Path(f) for f in model.info["router_files"]]
    from boute.quality.router_kinds import router_kind  # a model built without the list: its kind lists them

    return router_kind(model.router_kind).files(model.info["router_path"])


def verifier_of(model: QualityModel | None) -> str | None:
    """The verifier file a quality model scores cascades with (None for a model without one)."""
    return None if model is None else model.info.get("verifier_path")


def llm_judge_of(model: QualityModel | None) -> str | None:
    """The model name of the LLM judge whose recorded scores a quality model cuts cascades on (None: the
    model's cascades are the verifier's, or it has none)."""
    return model.judge.model if model is not None and model.judge.kind == "llm" else None


def judge_delay_of(model: QualityModel | None) -> float:
    """Seconds a judged cascade hop costs in the simulator and the fast path: the recorded LLM judge's mean
    latency per call when the quality model cuts on its scores, else the verifier's
    :data:`~boute.sim.engine.JUDGE_DELAY_S`. The one place the delay is decided."""
    from boute.sim.engine import JUDGE_DELAY_S

    j = None if model is None else model.judge
    return float(j.latency_s) if j is not None and j.kind == "llm" and j.latency_s is not None else JUDGE_DELAY_S


def policy_of(model: QualityModel, mode: str, fractions: tuple[float, ...]) -> PolicyResult:
    """The routing policy's quality and per-tier load for ``fractions`` in ``mode``."""
    fn = model.cascade if mode == "cascade" else model.preroute
    return fn(np.asarray(fractions, dtype=float))


def floats(values: Any) -> tuple[float, ...]:
    """An array-like flattened to a tuple of floats (what a result's per-tier fields hold)."""
    return tuple(float(v) for v in np.asarray(values).reshape(-1))
