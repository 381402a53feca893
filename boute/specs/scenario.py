"""The scenario: what the operator has (cluster), serves (tiers, workload) and promises (targets).

Loaded from YAML. Names of GPUs and models are checked against the packaged catalog plus the scenario's
own ``gpus:``/``models:`` entries, so a user adds hardware without editing the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    model_validator,
)

from boute.catalog import Catalog, GPUSpec, ModelSpec, builtin_catalog
from boute.specs.balancing import Affinity
from boute.specs.io import read_mapping, validate
from boute.specs.targets import Targets

Dtype = Literal["bf16", "fp8"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Cluster(_Frozen):
    """GPU inventory per type and the price budget."""

    gpus: dict[str, NonNegativeInt] = Field(description="GPU type -> how many are available")
    budget_per_hour: PositiveFloat = Field(description="USD per hour the deployment may cost")
    prices: dict[str, float] = Field(default_factory=dict, description="GPU type -> USD/GPU-hour override")

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        if not self.gpus:
            raise ValueError("at least one GPU type is needed")
        for name, price in self.prices.items():
            if price < 0:
                raise ValueError(f"price of '{name}' must be >= 0")
        return self


class Tier(_Frozen):
    """One model tier, small to large; ``quality_model`` is its column in the quality profile."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$")
    model: str
    quality_model: str | None = Field(None, description="model name in the quality profile (default: tier name)")
    dtype: Dtype = "bf16"


class QualitySource(_Frozen):
    """Where per-query quality comes from: ``builtin:gsm8k``, ``builtin:mt-bench`` or a file path."""

    profile: str = "builtin:gsm8k"
    format: Literal["auto", "routellm-csv", "routerbench", "mtbench-jsonl", "jsonl"] = "auto"
    router: str | None = Field(None, description="trained router file; trained on the fly if absent")
    router_kind: Literal["ladder", "multi"] = Field(
        "ladder",
        description="what pre-routes: 'ladder' (one difficulty score cut by thresholds) or 'multi' (each tier's "
        "predicted correctness p_k, routed to argmax p_k - lambda_k with prices giving the load fractions); "
        "both are trained on the fly",
    )
    judge: Literal["verifier", "llm"] = Field(
        "verifier",
        description="what scores a cascade's answers: the offline verifier, or the LLM judge whose scores the "
        "profile recorded (boute profile quality --cascade-judge); thresholds are cut on that judge's scores",
    )


class Arrivals(_Frozen):
    """Arrival process: a real trace replayed at ``rate_rps`` or a synthetic renewal process."""

    kind: Literal["trace", "poisson", "gamma"] = "trace"
    trace: str = Field("builtin:azure-conv", description="Azure-format CSV (TIMESTAMP, ContextTokens, ...)")
    cv: PositiveFloat = Field(1.0, description="coefficient of variation of inter-arrivals (gamma)")


class Lengths(_Frozen):
    """Request lengths in tokens.

    ``profile``: prompts of the quality profile and their recorded responses (the paper's workload);
    ``trace``: the trace's own ContextTokens/GeneratedTokens; ``fixed``/``lognormal``: synthetic.
    """

    source: Literal["profile", "trace", "fixed", "lognormal"] = "profile"
    input_tokens: PositiveFloat = 512
    output_tokens: PositiveFloat = 128
    sigma: PositiveFloat = Field(0.8, description="lognormal shape (log-space std)")
    max_input: PositiveInt = 8192
    max_output: PositiveInt = 4096
    scale: PositiveFloat = Field(1.0, description="multiply all lengths (sensitivity studies)")
    input_scale: PositiveFloat = Field(1.0, description="multiply prompt lengths (a re-plan's observed shift)")
    output_scale: PositiveFloat = Field(1.0, description="multiply answer lengths (a re-plan's observed shift)")


class ScoreMix(_Frozen):
    """The traffic's difficulty mix, in place of the profile's own: the share of requests whose router score
    falls in each bin (bin ``k`` holds ``edges[k-1] < score <= edges[k]``, the tiers' own rule).

    A re-plan writes the mix the gateways measured, so the search sees the tier loads and the quality the
    shifted traffic brings (harder prompts reach the large tier more often); a what-if study may write one
    by hand. Profile prompts are re-weighted to it, bin by bin (:func:`boute.quality.shares.mix_weights`).
    """

    edges: list[float] = Field(min_length=1, description="router-score bin edges, strictly ascending")
    shares: list[float] = Field(description="share of requests per bin (len(edges) + 1 values, >= 0)")

    @model_validator(mode="after")
    def _check(self) -> ScoreMix:
        if any(not b > a for a, b in zip(self.edges, self.edges[1:], strict=False)):
            raise ValueError("edges must be strictly ascending")
        if len(self.shares) != len(self.edges) + 1:
            raise ValueError(f"shares: expected {len(self.edges) + 1} values (one per bin), got {len(self.shares)}")
        if any(not (s >= 0 and s < float("inf")) for s in self.shares) or sum(self.shares) <= 0:
            raise ValueError("shares must be finite, >= 0 and not all 0")
        return self


class SystemPrompts(_Frozen):
    """Shared system prompts: each conversation opens with one of ``count`` prompts of ``min_tokens`` to
    ``max_tokens`` tokens (uniform), the k-th most popular chosen with probability proportional to
    ``k ** -zipf`` (agents, RAG templates: a few prompts carry most traffic)."""

    count: PositiveInt = Field(8, description="how many distinct system prompts")
    min_tokens: PositiveInt = Field(500, description="shortest system prompt, tokens")
    max_tokens: PositiveInt = Field(3000, description="longest system prompt, tokens")
    zipf: float = Field(1.1, ge=0, le=10, description="popularity skew: P(k) proportional to k^-zipf (0: uniform)")

    @model_validator(mode="after")
    def _check(self) -> SystemPrompts:
        if self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= min_tokens ({self.min_tokens})")
        return self


class Conversations(_Frozen):
    """Multi-turn conversations: each conversation has ``turns`` requests on one conversation id, and turn
    k + 1's prompt repeats turn k's prompt and its answer before the new question (MT-Bench's turn 2).
    Turn k + 1 takes the first arrival at least ``think_s`` (exponential, this mean) after turn k's."""

    turns: int = Field(2, ge=1, le=64, description="requests per conversation")
    think_s: float = Field(20.0, ge=0, description="mean gap from one turn's arrival to the next's, seconds")


class Prefixes(_Frozen):
    """What the requests' prompts share, for the prefix cache (:mod:`boute.workload.prefixes`); absent: no
    prompt shares a prefix with another, as before."""

    system_prompts: SystemPrompts | None = None
    conversations: Conversations | None = None


class Workload(_Frozen):
    arrivals: Arrivals = Arrivals()
    rate_rps: PositiveFloat = 100.0
    lengths: Lengths = Lengths()
    mix: ScoreMix | None = Field(None, description="observed difficulty mix (a re-plan's); default: the profile's")
    duration_s: PositiveFloat = Field(60.0, description="simulated horizon in seconds")
    seed: NonNegativeInt = 0
    prefixes: Prefixes | None = Field(None, description="shared system prompts and multi-turn conversations")

    @model_validator(mode="after")
    def _check(self) -> Workload:
        sp = self.prefixes.system_prompts if self.prefixes is not None else None
        if sp is not None and sp.max_tokens >= self.lengths.max_input:
            raise ValueError(
                f"prefixes.system_prompts.max_tokens ({sp.max_tokens}) must be below lengths.max_input "
                f"({self.lengths.max_input}): a prompt holds its system prompt and at least one token more"
            )
        return self


class TargetSection(_Frozen):
    """The ``targets:`` section of a scenario file; with the cluster's budget it makes :attr:`Scenario.goal`."""

    quality_floor: float = Field(0.0, ge=0, le=1, description="minimum expected quality, profile scale [0,1]")
    p95_latency_s: PositiveFloat = Field(30.0, description="P95 end-to-end latency cap, seconds")
    quality_confidence: float = Field(
        0.95,
        ge=0.5,
        lt=1,
        description="level of the one-sided lower confidence bound a plan states on its held-out quality "
        "(boute.quality.confidence)",
    )
    floor_on: Literal["mean", "bound"] = Field(
        "mean",
        description="what must meet the quality floor: the held-out mean, or its lower confidence bound "
        "(boute optimize --quality-confidence)",
    )


class Balancing(_Frozen):
    """How the gateway shares a tier's load among its replicas, which the plans are judged under (the simulator
    balances as the gateway will) and which each plan carries: capacity-weighted least load, and, with an
    ``affinity`` section, prefix affinity bounded by load (:class:`boute.specs.balancing.Affinity`)."""

    affinity: Affinity | None = Field(None, description="cache-aware balancing (absent: least load only)")


class Scenario(_Frozen):
    """Everything the optimiser needs to know about one serving problem."""

    name: str = "scenario"
    description: str = ""
    cluster: Cluster
    tiers: list[Tier] = Field(min_length=1)
    quality: QualitySource = QualitySource()
    workload: Workload = Workload()
    targets: TargetSection = TargetSection()
    balancing: Balancing = Balancing()
    gpus: list[GPUSpec] = Field(default_factory=list, description="extra GPU types (or overrides)")
    models: list[ModelSpec] = Field(default_factory=list, description="extra model architectures")
    calibration: str | None = Field(None, description="calibration file overriding efficiency factors")

    _catalog: Catalog = PrivateAttr()
    _source: Path | None = PrivateAttr(default=None)
    _reference: str | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _resolve(self) -> Scenario:
        cat = builtin_catalog().extended(self.gpus, self.models)
        for gpu in self.cluster.gpus:
            if gpu not in cat.gpus:
                raise ValueError(f"cluster.gpus: unknown GPU '{gpu}' (known: {', '.join(sorted(cat.gpus))})")
        for gpu in self.cluster.prices:
            if gpu not in self.cluster.gpus:
                raise ValueError(f"cluster.prices: '{gpu}' is not in cluster.gpus")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tiers: names must be unique, got {names}")
        for i, tier in enumerate(self.tiers):
            if tier.model not in cat.models:
                raise ValueError(
                    f"tiers[{i}].model: unknown model '{tier.model}' (known: {', '.join(sorted(cat.models))})"
                )
        self._catalog = cat
        return self

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    @property
    def goal(self) -> Targets:
        """What a plan must meet: the quality floor, the P95 cap and the budget (the one feasibility rule)."""
        t = self.targets
        return Targets(t.quality_floor, t.p95_latency_s, self.cluster.budget_per_hour)

    @property
    def source(self) -> Path | None:
        """The file this scenario was loaded from; relative paths inside it resolve against its folder."""
        return self._source

    @property
    def reference(self) -> str:
        """What :func:`load_scenario` takes to load this scenario again (``builtin:NAME`` or the file's path);
        plans record it, so ``boute serve``/``boute deploy`` of a plan find its scenario."""
        if self._reference is not None:
            return self._reference
        return str(self._source) if self._source is not None else self.name

    def price(self, gpu: str) -> float:
        """USD per GPU-hour: the cluster's override if any, else the catalog's."""
        override = self.cluster.prices.get(gpu)
        return override if override is not None else self._catalog.gpu(gpu).price_per_hour

    def resolve_path(self, ref: str) -> Path:
        """A file path named in this scenario, relative to the scenario file's folder."""
        p = Path(ref)
        if not p.is_absolute() and self._source is not None:
            p = self._source.parent / p
        return p

    def tier(self, name: str) -> Tier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(f"unknown tier '{name}' (known: {', '.join(t.name for t in self.tiers)})")


def with_quality_confidence(scenario: Scenario, level: float | None) -> Scenario:
    """The scenario with its quality floor held on the lower confidence bound at ``level`` (None: as is)."""
    if level is None:
        return scenario
    targets = TargetSection.model_validate(
        {**scenario.targets.model_dump(), "quality_confidence": level, "floor_on": "bound"}
    )
    return scenario.model_copy(update={"targets": targets})  # (private attributes: source, catalog, are kept)


def with_judge(scenario: Scenario, judge: str | None) -> Scenario:
    """The scenario with its cascade judge set to ``judge`` (``verifier`` or ``llm``; None: as is)."""
    if judge is None:
        return scenario
    quality = QualitySource.model_validate({**scenario.quality.model_dump(), "judge": judge})
    return scenario.model_copy(update={"quality": quality})  # (private attributes: source, catalog, are kept)


def with_router_kind(scenario: Scenario, kind: str | None) -> Scenario:
    """The scenario pre-routed by ``kind`` (``ladder`` or ``multi``; None: as is)."""
    if kind is None:
        return scenario
    quality = QualitySource.model_validate({**scenario.quality.model_dump(), "router_kind": kind})
    return scenario.model_copy(update={"quality": quality})


def with_affinity(scenario: Scenario, affinity: Affinity | None) -> Scenario:
    """The scenario balanced by ``affinity`` (``Affinity(enabled=False)``: least load; None: as is)."""
    if affinity is None:
        return scenario
    return scenario.model_copy(update={"balancing": Balancing(affinity=affinity)})


def load_scenario(path: str | Path | None = None) -> Scenario:
    """Load a scenario YAML file; ``None`` or ``builtin:NAME`` gives a packaged example.

    A bare built-in name (``paper-gsm8k``) that is not a file here also loads the example: plans written
    before they recorded ``builtin:NAME`` name their scenario that way.
    """
    from boute.scenarios import builtin_scenario_path, builtin_scenarios

    bare = path is not None and not Path(path).exists() and str(path) in builtin_scenarios()
    if path is None or str(path).startswith("builtin:") or bare:
        name = "paper-gsm8k" if path is None else str(path).removeprefix("builtin:")
        p = builtin_scenario_path(name)
        shown: str | Path = f"builtin:{name}"
    else:
        p = Path(path)
        shown = p
    return scenario_from_mapping(read_mapping(p), p, shown)


def scenario_from_mapping(data: dict[str, Any], source: Path, shown: str | Path) -> Scenario:
    """A scenario from its document; relative file references in it resolve against ``source``'s folder."""
    scenario = validate(Scenario, data, shown)
    scenario._source = Path(source).resolve()
    scenario._reference = shown if isinstance(shown, str) else str(Path(source).resolve())
    return scenario
