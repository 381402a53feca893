"""Measured load points -> the performance model's calibration factors for one GPU type, and the file.

The fit itself is :func:`boute.perf.calibration.fit_efficiency` (least squares in log space over TTFT and
TPOT). This module only turns a sweep into its :class:`MeasuredPoint` s and writes the result where
``boute perf --calibration`` and a scenario's ``calibration:`` read it.

Mapping a closed-loop load point to the model's static batch is an approximation: ``concurrency`` c
becomes batch c for TPOT (c sequences decode together on a batching engine) and TTFT is the prefill of one
prompt of the measured length. Engines that serve one request at a time (llama-cpp-python's server) give
``max_batch=1``: only their concurrency-1 points are fitted, since at higher concurrency the client-seen
TTFT is queueing, which the simulator, not the replica model, accounts for. Open-loop (``rate_rps``) points
are recorded but never fitted, for the same reason.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from backends.profile.loadgen import PointResult
from boute.catalog import Catalog, Efficiency
from boute.perf.calibration import FitResult, MeasuredPoint, fit_efficiency, predict_point
from boute.specs.io import read_mapping, write_atomic

__all__ = ["MeasuredReplica", "compare", "fit_sweep", "measured_points", "write_calibration", "write_results"]


@dataclass(frozen=True)
class MeasuredReplica:
    """What was measured: a catalog model on a catalog GPU type with its parallelism and dtype."""

    model: str
    gpu: str
    tp: int = 1
    pp: int = 1
    dtype: str = "bf16"
    max_batch: int | None = None  # the engine's own cap on concurrent sequences (1 for a serial server)


def measured_points(results: Sequence[PointResult], replica: MeasuredReplica, source: str = "") -> list[MeasuredPoint]:
    """TTFT and TPOT points of the closed-loop results the replica model can explain."""
    out: list[MeasuredPoint] = []
    for r in results:
        p = r.point
        if r.completed == 0 or p.rate_rps is not None:
            continue
        if replica.max_batch is not None and p.concurrency > replica.max_batch:
            continue
        shape = {
            "model": replica.model,
            "gpu": replica.gpu,
            "tp": replica.tp,
            "pp": replica.pp,
            "dtype": replica.dtype,
            "input_len": max(1, round(r.mean_input_tokens)),
            "output_len": max(2, round(r.mean_output_tokens)),
            "source": source or f"profile c={p.concurrency} in={p.input_len} out={p.output_len}",
        }
        # medians: the replica model is deterministic, and one request slowed by a noisy neighbour (a shared
        # host, a GC pause) skews a mean of a few requests, not their median
        if np.isfinite(r.ttft_ms_p50) and r.ttft_ms_p50 > 0:
            out.append(MeasuredPoint(metric="ttft_ms", value=r.ttft_ms_p50, batch=1, **shape))
        if np.isfinite(r.tpot_ms_p50) and r.tpot_ms_p50 > 0:
            out.append(MeasuredPoint(metric="tpot_ms", value=r.tpot_ms_p50, batch=p.concurrency, **shape))
    return out


def fit_sweep(points: Sequence[MeasuredPoint], catalog: Catalog, gpu: str, prior_weight: float = 0.05) -> FitResult:
    """Fit the GPU type's efficiency factors to the points (raises ValueError when there are none)."""
    return fit_efficiency(points, catalog, gpu, prior_weight=prior_weight)


def compare(
    points: Sequence[MeasuredPoint], catalog: Catalog, efficiency: Efficiency | None = None
) -> list[dict[str, Any]]:
    """Predicted vs measured for each point: ``error_pct`` = 100 * (predicted - measured) / measured."""
    rows = []
    for p in points:
        pred = predict_point(p, catalog, efficiency)
        rows.append(
            {
                "metric": p.metric,
                "batch": p.batch,
                "input_len": p.input_len,
                "output_len": p.output_len,
                "measured": round(p.value, 3),
                "predicted": round(pred, 3),
                "error_pct": round(100.0 * (pred - p.value) / p.value, 2),
            }
        )
    return rows


def write_calibration(path: str | Path, fit: FitResult) -> Path:
    """Write (or update: other GPUs in an existing file are kept) the calibration file, atomically."""
    p = Path(path)
    data: dict[str, Any] = read_mapping(p) if p.exists() else {}
    gpus = dict(data.get("gpus") or {})
    eff = fit.efficiency.model_dump(exclude_none=True)
    gpus[fit.gpu] = {k: round(float(v), 6) for k, v in eff.items() if k in fit.fitted}
    data["gpus"] = gpus
    return write_atomic(p, yaml.safe_dump(data, sort_keys=False))


def write_results(path: str | Path, results: Sequence[PointResult], meta: dict[str, Any]) -> Path:
    """The raw sweep as JSON (used where the tracking DB is not available)."""
    doc = {"meta": meta, "points": [r.to_dict() for r in results]}
    return write_atomic(path, json.dumps(doc, indent=2, default=float) + "\n")
