"""The plan: the optimiser's output and the router's/deployer's input.

A plan is a readable JSON/YAML file: routing (load fraction or threshold per tier) + deployment (replica
groups: model, GPU type, count, TP, PP) + what the evaluator predicted for it.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveInt, model_validator

from boute.catalog import Catalog
from boute.errors import SpecError
from boute.specs.io import dump_model, read_mapping, validate
from boute.specs.scenario import Dtype


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

    ``preroute``: a router score orders queries by difficulty; ``fractions[i]`` of the load goes to tier i
    (the optimiser's encoding), equivalently ``thresholds`` on the score (calibrated quantiles).
    ``cascade``: every query starts at tier 0; a judge's score below ``thresholds[i]`` escalates to i+1.
    """

    mode: Literal["preroute", "cascade"] = "preroute"
    tiers: list[str] = Field(min_length=1)
    fractions: list[NonNegativeFloat] | None = None
    thresholds: list[float] | None = None
    router: str | None = Field(None, description="trained router / verifier file the gateway loads")

    @model_validator(mode="after")
    def _check(self) -> Routing:
        n = len(self.tiers)
        if len(set(self.tiers)) != n:
            raise ValueError("tiers must be unique")
        if self.fractions is None and self.thresholds is None:
            raise ValueError("give fractions or thresholds")
        if self.fractions is not None:
            if len(self.fractions) != n:
                raise ValueError(f"fractions needs {n} values (one per tier), got {len(self.fractions)}")
            if not math.isclose(sum(self.fractions), 1.0, abs_tol=1e-6):
                raise ValueError(f"fractions must sum to 1, got {sum(self.fractions):.6g}")
        if self.thresholds is not None and len(self.thresholds) != n - 1:
            raise ValueError(f"thresholds needs {n - 1} values (between tiers), got {len(self.thresholds)}")
        return self


class Prediction(_Frozen):
    """What an evaluator predicted for the plan (all approximate: the performance model is)."""

    quality: float | None = None
    p95_latency_s: float | None = None
    p50_latency_s: float | None = None
    mean_latency_s: float | None = None
    throughput_rps: float | None = None
    cost_per_hour: float | None = None
    evaluator: str | None = None
    feasible: bool | None = None


class Plan(_Frozen):
    version: Literal[1] = 1
    scenario: str | None = None
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    routing: Routing
    deployment: list[ReplicaGroup] = Field(min_length=1)
    predicted: Prediction | None = None

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
