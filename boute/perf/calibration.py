"""Efficiency calibration: files that override the per-GPU factors, and fitting them to measurements.

Datasheet peaks are never reached; the performance model multiplies them by per-GPU efficiency factors
(``GPUSpec.efficiency``). The packaged factors are the family values of the fit on published measurements
(:mod:`boute.perf.fit`, docs/perf-model.md); a calibration file overrides them per GPU.
A user who has measured their own hardware writes a calibration file::

    gpus:
      h100-sxm: {compute: 0.7, bandwidth: 0.85}          # partial: other factors keep their values
      rtx-4090: {step_overhead_ms: 2.0, link: 0.4}

and names it in the scenario (``calibration: my-cal.yaml``); :func:`scenario_catalog` applies it.
:func:`fit_efficiency` least-squares fits the factors of one GPU type to measured points (TTFT, TPOT or
throughput at a given batch and lengths); live profiling reuses it to write such a file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from boute.catalog import Catalog, Efficiency
from boute.errors import SpecError, from_validation_error
from boute.perf.dataset import METRICS, Metric
from boute.perf.model import DEFAULT_MEM_FRACTION, replica_perf
from boute.specs.io import read_mapping, write_atomic

if TYPE_CHECKING:
    from boute.specs.scenario import Scenario

FACTORS: tuple[str, ...] = ("compute", "compute_fp8", "bandwidth", "link", "step_overhead_ms")
#: search bounds of each factor while fitting
_BOUNDS: dict[str, tuple[float, float]] = {
    "compute": (0.005, 1.0),  # low floor: CPU engines and generic builds reach a few % of a SIMD peak
    "compute_fp8": (0.005, 1.0),
    "bandwidth": (0.005, 1.0),
    "link": (0.05, 1.0),
    "step_overhead_ms": (0.0, 20.0),
}


class _Override(BaseModel):
    """One GPU's partial override; same bounds as :class:`~boute.catalog.Efficiency`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute: float | None = Field(None, gt=0, le=1)
    compute_fp8: float | None = Field(None, gt=0, le=1)
    compute_fp4: float | None = Field(None, gt=0, le=1)
    bandwidth: float | None = Field(None, gt=0, le=1)
    link: float | None = Field(None, gt=0, le=1)
    step_overhead_ms: float | None = Field(None, ge=0)
    gemm_half_tokens: float | None = Field(None, ge=0)


class _CalibrationFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: dict[str, _Override] = Field(default_factory=dict)


@dataclass(frozen=True)
class Calibration:
    """Per-GPU partial efficiency overrides, with the file they came from (for error messages)."""

    gpus: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: MappingProxyType({}))
    source: str | None = None


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration YAML/JSON file; every mistake is a SpecError naming the file and field."""
    data = read_mapping(path)
    try:
        parsed = _CalibrationFile.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, path) from None
    gpus = {name: MappingProxyType(o.model_dump(exclude_none=True)) for name, o in parsed.gpus.items()}
    return Calibration(gpus=MappingProxyType(gpus), source=str(path))


def apply_calibration(catalog: Catalog, calibration: Calibration) -> Catalog:
    """A catalog whose GPUs carry the calibration's factors (unnamed factors and GPUs are unchanged)."""
    updated = []
    for name, factors in calibration.gpus.items():
        if name not in catalog.gpus:
            known = ", ".join(sorted(catalog.gpus))
            raise SpecError(calibration.source, f"gpus.{name}", f"unknown GPU '{name}' (known: {known})")
        gpu = catalog.gpus[name]
        eff = Efficiency.model_validate({**gpu.efficiency.model_dump(), **factors})
        updated.append(gpu.model_copy(update={"efficiency": eff}))
    return catalog.extended(gpus=updated)


def scenario_catalog(scenario: Scenario) -> Catalog:
    """The scenario's catalog with its calibration file (``Scenario.calibration``) applied, if any."""
    if not scenario.calibration:
        return scenario.catalog
    path = scenario.resolve_path(scenario.calibration)
    return apply_calibration(scenario.catalog, load_calibration(path))


def with_calibration(scenario: Scenario, path: str | Path) -> Scenario:
    """The scenario with calibration file ``path`` in place of its own (``--calibration`` of the CLI).

    The file is read and checked against the scenario's GPUs now, so a mistake is reported before any work.
    """
    apply_calibration(scenario.catalog, load_calibration(path))
    return scenario.model_copy(update={"calibration": str(Path(path).resolve())})


def save_calibration(path: str | Path, efficiencies: Mapping[str, Efficiency]) -> Path:
    """Write fitted factors as a calibration file (atomically), loadable by :func:`load_calibration`."""
    data = {"gpus": {name: eff.model_dump(exclude_none=True) for name, eff in efficiencies.items()}}
    return write_atomic(path, yaml.safe_dump(data, sort_keys=False))


# ---- measured points and fitting -------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredPoint:
    """One measurement of a replica: a metric at a given static batch and prompt/output lengths.

    ``ttft_ms`` is the prefill of ``batch`` prompts; ``tpot_ms`` and ``output_tokens_per_s`` describe a
    static batch (all prompts prefilled, then decoded together), as profilers and published tables run
    them. ``per_gpu`` divides throughput by the replica's GPU count.
    """

    model: str
    gpu: str
    metric: Metric
    value: float
    batch: int = 1
    input_len: int = 128
    output_len: int = 128
    tp: int = 1
    pp: int = 1
    dtype: str = "bf16"
    per_gpu: bool = False
    mem_fraction: float = DEFAULT_MEM_FRACTION
    source: str = ""
    #: speed of the engine that measured the point relative to the reference the GPU's factors describe
    #: (1 for your own engine; a published row of an old TensorRT-LLM release: that release's fitted speed)
    speed: float = 1.0

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got '{self.metric}'")
        if self.value <= 0:
            raise ValueError(f"measured value must be > 0, got {self.value}")


def predict_point(point: MeasuredPoint, catalog: Catalog, efficiency: Efficiency | None = None) -> float:
    """The performance model's value for ``point`` (with ``efficiency`` replacing the GPU's factors)."""
    gpu = catalog.gpu(point.gpu)
    if efficiency is not None:
        gpu = gpu.model_copy(update={"efficiency": efficiency})
    perf = replica_perf(
        catalog.model(point.model), gpu, point.tp, point.pp, point.dtype, point.mem_fraction, speed=point.speed
    )
    if point.metric == "ttft_ms":
        n = float(point.batch * point.input_len)
        return float(perf.prefill_time(n, point.batch * float(point.input_len) ** 2)) * 1e3
    res = perf.static_batch(point.batch, point.input_len, point.output_len)
    if point.metric == "tpot_ms":
        return float(res["tpot_ms"])
    thr = float(res["output_tokens_per_s"])
    return thr / perf.gpus if point.per_gpu else thr


@dataclass(frozen=True)
class FitResult:
    """Fitted factors of one GPU type and how well they reproduce the points they were fitted on."""

    gpu: str
    efficiency: Efficiency
    fitted: tuple[str, ...]
    errors_pct: np.ndarray  # signed, 100 * (predicted - measured) / measured, one per point
    n_points: int

    @property
    def median_abs_error_pct(self) -> float:
        return float(np.median(np.abs(self.errors_pct)))


def identifiable_factors(points: Sequence[MeasuredPoint]) -> tuple[str, ...]:
    """The factors the points can inform: compute per dtype seen, link only with multi-GPU replicas."""
    out = ["bandwidth", "step_overhead_ms"]
    if any(p.dtype == "bf16" for p in points):
        out.insert(0, "compute")
    if any(p.dtype == "fp8" for p in points):
        out.insert(0, "compute_fp8")
    if any(p.tp * p.pp > 1 for p in points):
        out.append("link")
    return tuple(f for f in FACTORS if f in out)


def fit_efficiency(
    points: Sequence[MeasuredPoint],
    catalog: Catalog,
    gpu: str,
    *,
    factors: Sequence[str] | None = None,
    start: Efficiency | None = None,
    prior_weight: float = 0.05,
) -> FitResult:
    """Least-squares fit of one GPU type's efficiency factors to measured points.

    Residuals are log(predicted / measured), so a 10% miss weighs the same on a 7 ms TTFT as on a
    20,000 tok/s throughput. A weak prior (``prior_weight`` per factor, in log units) pulls each factor
    towards ``start`` (default: the catalog's), which keeps factors the points barely inform from
    drifting to a bound; set it to 0 for a plain fit. Points of other GPUs are ignored.
    """
    from scipy.optimize import least_squares  # heavy import kept off the CLI start-up path

    mine = [p for p in points if p.gpu == gpu]
    if not mine:
        raise ValueError(f"no measured points for GPU '{gpu}'")
    base = start or catalog.gpu(gpu).efficiency
    names = tuple(factors) if factors is not None else identifiable_factors(mine)
    unknown = set(names) - set(FACTORS)
    if unknown:
        raise ValueError(f"unknown factors {sorted(unknown)} (known: {', '.join(FACTORS)})")
    start_vals = base.model_dump()
    if start_vals.get("compute_fp8") is None:
        start_vals["compute_fp8"] = start_vals["compute"]
    # overhead is fitted in log(ms + 0.1) space so it may approach zero without a sign flip
    x0 = np.array([_to_x(n, start_vals[n]) for n in names])
    lo = np.array([_to_x(n, _BOUNDS[n][0]) for n in names])
    hi = np.array([_to_x(n, _BOUNDS[n][1]) for n in names])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    measured = np.array([p.value for p in mine])

    def efficiency_at(x: np.ndarray) -> Efficiency:
        vals = dict(start_vals)
        if base.compute_fp8 is None and "compute_fp8" not in names:
            vals["compute_fp8"] = None  # stays "same as compute"
        vals.update({n: _from_x(n, v) for n, v in zip(names, x, strict=True)})
        return Efficiency.model_validate(vals)

    def residuals(x: np.ndarray) -> np.ndarray:
        eff = efficiency_at(x)
        pred = np.array([predict_point(p, catalog, eff) for p in mine])
        pred = np.where(np.isfinite(pred) & (pred > 0), pred, 1e-9)
        return np.concatenate([np.log(pred / measured), prior_weight * (x - x0)])

    sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale=1.0, diff_step=1e-3)
    eff = efficiency_at(sol.x)
    pred = np.array([predict_point(p, catalog, eff) for p in mine])
    return FitResult(
        gpu=gpu,
        efficiency=eff,
        fitted=names,
        errors_pct=100.0 * (pred - measured) / measured,
        n_points=len(mine),
    )


def _to_x(name: str, value: float) -> float:
    return float(np.log(value + 0.1)) if name == "step_overhead_ms" else float(np.log(value))


def _from_x(name: str, x: float) -> float:
    v = float(np.exp(x))
    return max(0.0, v - 0.1) if name == "step_overhead_ms" else min(1.0, v)
