"""The plan: the optimiser's output and the router's/deployer's input.

A plan is a readable JSON/YAML file: routing (load fraction or threshold per tier) + deployment (replica
groups: model, GPU type, count, TP, PP) + what the evaluator predicted for it.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from boute.catalog import Catalog
from boute.errors import SpecError
from boute.specs.balancing import Affinity
from boute.specs.io import dump_model, read_mapping, validate
from boute.specs.scenario import Dtype
from boute.specs.scorers import SCORER_RULES, scorer_name, scorer_spelling, spelled

#: how a plan routes: pre-route each request to one tier, or cascade it up the tiers while a judge rejects
RoutingMode = Literal["preroute", "cascade"]
#: the routing modes, in the order CLI errors list them
ROUTING_MODES: tuple[str, ...] = get_args(RoutingMode)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ReplicaGroup(_Frozen):
    """``count`` identical replicas of ``model`` on ``gpu``, each using ``tp * pp`` GPUs."""

    tier: str
    model: str
    gpu: str
    count: PositiveInt = 1
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    dtype: Dtype = "bf16"

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def gpus_used(self) -> int:
        return self.count * self.tp * self.pp


class Routing(_Frozen):
    """How queries are split over tiers (ordered small -> large).

    ``preroute``: a scorer orders queries by difficulty; ``fractions[i]`` of the load goes to tier i (the
    optimiser's encoding), equivalently ``thresholds`` on that scorer's score, cut on the ``reference``
    prompts (:func:`boute.quality.shares.thresholds_for_fractions`). The scorer is named, never implied:
    ``ladder`` is the trained ``router`` (a file of the plan's bundle; plans spell it ``learned``, read and
    written so, :mod:`boute.specs.scorers`), ``length`` the prompt-length CDF over the reference. ``cascade``: every query starts at tier 0; the ``judge``'s score of tier i's answer below
    ``thresholds[i]`` escalates to i+1. The judge is named like the scorer, never implied, because the
    thresholds only mean something on the score they were cut on: ``verifier`` is the offline verifier the
    optimiser scored the cascade with (its weights file ``verifier``, in the plan's bundle), ``llm`` an
    LLM judge at the gateway's ``BOUTE_JUDGE_URL`` rating 1-10, read as ``(rating - 1) / 9``. A plan the
    optimiser cut on an LLM judge's recorded scores names that judge's model (``judge_model``): the gateway
    refuses to judge it with another.

    ``scorer: multi`` pre-routes with a multi-model router (``router``, its bundled file): tier(x) = argmax_k
    p_k(x) - ``prices[k]``, the prices (one per tier, +inf for a tier that gets nothing) being what
    :func:`boute.quality.multi.prices_for_shares` gives for ``fractions`` on the ``reference`` prompts, the
    rule the optimiser applied; a plan without them has them computed by that rule.
    """

    # a threshold beyond every score (a tier that accepts all or nothing) is +-inf: written as Infinity
    # (JSON) / .inf (YAML), read back as the same float, never as null
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    mode: RoutingMode = "preroute"
    tiers: list[str] = Field(min_length=1)
    fractions: list[NonNegativeFloat] | None = None
    thresholds: list[float] | None = None
    scorer: str | None = Field(None, description="what the thresholds (or, multi, the prices) apply to")
    prices: list[float] | None = Field(
        None, description="scorer 'multi': per-tier price lambda_k, tier = argmax p_k - lambda_k (+inf: never)"
    )
    router: str | None = Field(None, description="trained router file (relative to the plan's folder)")
    reference: str | None = Field(
        None, description="prompts the thresholds were cut on: builtin:NAME or a profile file (relative to the plan)"
    )
    judge: Literal["verifier", "llm"] | None = Field(None, description="cascade: what scores each hop's answer")
    verifier: str | None = Field(None, description="cascade verifier's weights file (relative to the plan's folder)")
    judge_model: str | None = Field(
        None, description="cascade 'llm' judge: the model whose recorded scores the thresholds were cut on"
    )

    @field_validator("scorer", mode="before")
    @classmethod
    def _scorer_name(cls, v: object) -> str | None:
        """The code's name of the scorer: plans spell the ladder ``learned`` and still load (so do plans that
        use the code's name); anything else is refused as the old ``Literal`` refused it."""
        if v is None:
            return None
        name = scorer_name(v)
        if name is None:
            expected = spelled(list(SCORER_RULES))
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return name

    @field_serializer("scorer")
    def _scorer_spelling(self, v: str | None) -> str | None:
        """Written as plans have always spelled it, so a gateway older than the ladder's name reads the plan."""
        return None if v is None else scorer_spelling(v)

    @model_validator(mode="after")
    def _check(self) -> Routing:
        n = len(self.tiers)
        if len(set(self.tiers)) != n:
            raise ValueError("tiers must be unique")
        if self.fractions is None and self.thresholds is None and self.prices is None:
            raise ValueError("give fractions, thresholds or (scorer 'multi') prices")
        if self.mode == "preroute":
            split = (
                self.thresholds is not None
                or self.prices is not None
                or sum(1 for f in self.fractions or [] if f > 0) > 1
            )
            self._check_scorer(split)
        if self.prices is not None:
            if self.mode != "preroute" or self.scorer is None or SCORER_RULES[self.scorer].cut != "prices":
                priced = spelled([r.name for r in SCORER_RULES.values() if r.cut == "prices"])
                raise ValueError(f"routing.prices are read with mode 'preroute' and scorer {priced} only")
            if len(self.prices) != n:
                raise ValueError(f"prices needs {n} values (one per tier), got {len(self.prices)}")
            if any(math.isnan(v) or v == -math.inf for v in self.prices):
                raise ValueError("prices must be numbers or +inf (a tier never chosen), not NaN or -inf")
        if self.judge is not None:
            if self.mode != "cascade":
                raise ValueError("routing.judge applies to cascades only (mode: cascade)")
            if self.thresholds is None:
                raise ValueError("a cascade judge needs routing.thresholds, cut on that judge's scores")
        if self.judge == "verifier" and self.verifier is None:
            raise ValueError("routing.judge 'verifier' needs routing.verifier (the verifier's weights file)")
        if self.verifier is not None and self.judge != "verifier":
            raise ValueError("routing.verifier is only read with routing.judge 'verifier'")
        if self.judge_model is not None and self.judge != "llm":
            raise ValueError("routing.judge_model is only read with routing.judge 'llm'")
        if self.fractions is not None:
            if len(self.fractions) != n:
                raise ValueError(f"fractions needs {n} values (one per tier), got {len(self.fractions)}")
            if not math.isclose(sum(self.fractions), 1.0, abs_tol=1e-6):
                raise ValueError(f"fractions must sum to 1, got {sum(self.fractions):.6g}")
        if self.thresholds is not None and len(self.thresholds) != n - 1:
            raise ValueError(f"thresholds needs {n - 1} values (between tiers), got {len(self.thresholds)}")
        return self

    def _check_scorer(self, split: bool) -> None:
        """A pre-route's scorer against its rule (:data:`~boute.specs.scorers.SCORER_RULES`): named when the load
        is split, with its router file when it needs one, cut the way it reads, with the prompts it was cut on."""
        if split and self.scorer is None:
            what = "thresholds need" if self.thresholds is not None else "splitting load between tiers needs"
            routed = spelled([r.name for r in SCORER_RULES.values() if r.needs_router])
            plain = spelled([r.name for r in SCORER_RULES.values() if not r.needs_router])
            raise ValueError(
                f"{what} routing.scorer, the scorer they apply to ({routed} with routing.router, or {plain})"
            )
        if self.scorer is None:
            return
        rule = SCORER_RULES[self.scorer]
        if rule.needs_router and self.router is None:
            raise ValueError(f"routing.scorer '{rule.spelling}' needs routing.router (the trained router file)")
        if rule.cut == "prices" and self.thresholds is not None:
            raise ValueError(f"routing.scorer '{rule.spelling}' routes by routing.prices, not thresholds")
        if self.reference is None:
            raise ValueError("routing.scorer needs routing.reference (the prompts its thresholds are cut on)")


class Prediction(_Frozen):
    """What an evaluator predicted for the plan (all approximate: the performance model is)."""

    quality: float | None = Field(None, description="held-out mean quality (profile scale [0, 1])")
    quality_bound: float | None = Field(
        None, description="one-sided lower confidence bound on it (boute.quality.confidence)"
    )
    quality_confidence: float | None = Field(None, description="level of quality_bound, e.g. 0.95")
    floor_on: Literal["mean", "bound"] | None = Field(None, description="what was held against the quality floor")
    p95_latency_s: float | None = None
    p50_latency_s: float | None = None
    mean_latency_s: float | None = None
    throughput_rps: float | None = None
    cost_per_hour: float | None = None
    evaluator: str | None = None
    feasible: bool | None = None
    tier_shares: list[float] | None = Field(
        None,
        description="share of the requests each tier answers at these thresholds: of the scenario's simulated"
        " request stream (evaluator sim), of the quality model's held-out prompts (evaluator fast)",
    )
    cached_token_share: float | None = Field(
        None, description="share of prompt tokens served from the replicas' prefix caches (simulated)"
    )
    ttft_p50_s: float | None = Field(None, description="time to first token, median (simulated)")
    ttft_p95_s: float | None = Field(None, description="time to first token, 95th percentile (simulated)")


class RequestLengths(_Frozen):
    """Moments of a workload's request lengths (tokens): what a replica's capacity is judged under."""

    mean_input: PositiveFloat
    input_sq_mean: PositiveFloat
    mean_output: PositiveFloat
    output_sq_mean: PositiveFloat


class Balance(_Frozen):
    """How a tier's load is shared among its replicas, as the simulator that judged the plan shares it.

    Both the simulator and the gateway send a request to the replica with the fewest outstanding requests
    per unit of capacity; the capacity is a replica's sustainable rate under the plan's own request
    lengths (:mod:`boute.sim.weights`). Computed by the core when the plan is written, so the gateway
    reads the figures instead of deriving its own.
    """

    lengths: RequestLengths = Field(description="the plan's workload's request lengths the capacities are for")
    capacity_rps: list[PositiveFloat] = Field(description="one replica's capacity in each deployment group, in order")


class Artifact(_Frozen):
    """A file the plan needs (router weights, a user profile or trace, a calibration), in its bundle."""

    path: str = Field(description="relative to the plan file's folder")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _inside_the_bundle(cls, v: str) -> str:
        # plans travel over Redis and the admin API: a path must not reach outside the plan's folder (or
        # the cache it is materialised into), whatever the sender wrote
        p = PurePosixPath(v.replace("\\", "/"))
        if not v or p.is_absolute() or ".." in p.parts or PureWindowsPath(v).drive:
            raise ValueError(f"must be a relative path inside the plan's folder, got {v!r}")
        return v


class Plan(_Frozen):
    """What serving needs to reproduce the optimised routing and deployment, self-contained.

    ``scenario_spec`` is the scenario the plan was optimised for (catalog extras, calibration, workload,
    targets), with its file references rewritten to bundle files: relative paths resolve against the plan
    file's folder, and ``artifacts`` lists every such file with its content hash, checked on load.
    """

    version: Literal[1] = 1
    scenario: str | None = Field(None, description="where the scenario came from (informational)")
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    routing: Routing
    deployment: list[ReplicaGroup] = Field(min_length=1)
    predicted: Prediction | None = None
    objective: str | None = Field(
        None, description="what chose this plan among those meeting the targets: latency | cost | pareto:<prefer>"
    )
    scenario_spec: dict[str, Any] | None = None
    artifacts: list[Artifact] = Field(default_factory=list)
    balance: Balance | None = Field(
        None, description="replica capacities the gateway balances by (written with the plan)"
    )
    affinity: Affinity | None = Field(
        None, description="cache-aware (prefix-affinity) balancing within a tier; absent: least load only"
    )

    def affinity_in_force(self) -> Affinity | None:
        """The balancing the plan itself asks for: its ``affinity`` section when present and enabled, else None
        (least load only). The simulator balances by it; the gateway too, unless its own switch overrides it
        (``router.balancer.affinity_in_force``)."""
        return self.affinity if self.affinity is not None and self.affinity.enabled else None

    @model_validator(mode="after")
    def _check(self) -> Plan:
        deployed = {g.tier for g in self.deployment}
        for i, g in enumerate(self.deployment):
            if g.tier not in self.routing.tiers:
                raise ValueError(f"deployment[{i}].tier: '{g.tier}' is not one of routing.tiers")
        missing = [t for t in self.routing.tiers if t not in deployed]
        fr = self.routing.fractions
        needed = [t for i, t in enumerate(self.routing.tiers) if fr is None or fr[i] > 0]
        if any(t in missing for t in needed):
            raise ValueError(f"routing sends load to tiers with no replicas: {[t for t in needed if t in missing]}")
        if self.balance is not None and len(self.balance.capacity_rps) != len(self.deployment):
            raise ValueError(
                f"balance.capacity_rps: needs {len(self.deployment)} values (one per deployment group), "
                f"got {len(self.balance.capacity_rps)}"
            )
        return self

    def groups(self, tier: str) -> list[ReplicaGroup]:
        return [g for g in self.deployment if g.tier == tier]

    def gpus_used(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.deployment:
            out[g.gpu] = out.get(g.gpu, 0) + g.gpus_used
        return out


def check_plan_hardware(plan: Plan, catalog: Catalog, file: str | Path | None = None) -> None:
    """Static checks a plan needs before anything runs: known GPU/model, TP divides heads, PP <= layers."""
    for i, g in enumerate(plan.deployment):
        if g.gpu not in catalog.gpus:
            raise SpecError(file, f"deployment[{i}].gpu", f"unknown GPU '{g.gpu}'")
        if g.model not in catalog.models:
            raise SpecError(file, f"deployment[{i}].model", f"unknown model '{g.model}'")
        m = catalog.model(g.model)
        if m.heads % g.tp:
            raise SpecError(file, f"deployment[{i}].tp", f"tp={g.tp} does not divide {g.model}'s {m.heads} heads")
        if g.pp > m.layers:
            raise SpecError(file, f"deployment[{i}].pp", f"pp={g.pp} exceeds {g.model}'s {m.layers} layers")
        if g.dtype == "fp8" and catalog.gpu(g.gpu).tflops_fp8 is None:
            raise SpecError(file, f"deployment[{i}].dtype", f"{g.gpu} has no FP8 support")


def load_plan(path: str | Path, catalog: Catalog | None = None) -> Plan:
    """Load a plan file and run the static hardware checks against ``catalog`` (packaged by default)."""
    from boute.catalog import builtin_catalog

    plan = validate(Plan, read_mapping(path), path)
    check_plan_hardware(plan, catalog or builtin_catalog(), path)
    return plan


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write atomically: the router and deployer never read half a plan."""
    return dump_model(plan, path)
