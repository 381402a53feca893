"""The rows of ``../shared/reference/measurements.md`` as calibration points, and predicted-vs-published tables.

Those rows (NVIDIA TensorRT-LLM v0.5/v0.6.1 static-batch tables) are now rows of the packaged dataset
(``boute/perf/data/published.csv``, sources ``trtllm-v0.6.1`` and ``trtllm-v0.5``); this module turns them
into :class:`~boute.perf.calibration.MeasuredPoint` s, the form ``fit_efficiency`` and ``boute profile perf``
use, so the two stay one set of numbers. ``REFERENCE`` holds the 11 rows of measurements.md and
``HELD_OUT`` the other LLaMA rows of the same tables.

Run ``python -m boute.perf.measurements`` to print the markdown tables used in docs/perf-model.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from boute.catalog import Catalog, builtin_catalog
from boute.perf.calibration import MeasuredPoint, predict_point
from boute.perf.dataset import PublishedRow, is_metric, published_rows
from boute.perf.engines import ENGINES
from boute.perf.fit import speeds
from boute.perf.model import replica_perf
from boute.perf.rows import speed_of
from boute.perf.structure import packaged_fit

#: TensorRT-LLM static engines pre-allocate nearly all device memory (not SGLang's 0.88)
TRT_MEM_FRACTION = ENGINES["trtllm-static"].mem_fraction or 0.98

#: (model, gpu, tp, metric, batch, input, output) of every row of measurements.md
_REFERENCE_KEYS = (
    ("llama-7b", "h100-sxm", 1, "output_tokens_per_s", 768, 128, 128),
    ("llama-7b", "a100-80gb", 1, "output_tokens_per_s", 384, 128, 128),
    ("llama-7b", "a100-80gb", 1, "output_tokens_per_s", 60, 128, 2048),
    ("llama-2-70b", "a100-80gb", 4, "output_tokens_per_s", 1280, 128, 128),
    ("llama-7b", "l40s", 1, "output_tokens_per_s", 64, 128, 128),
    ("llama-7b", "a100-80gb", 1, "ttft_ms", 1, 128, 1),
    ("llama-7b", "a100-80gb", 1, "ttft_ms", 1, 2048, 1),
    ("llama-2-70b", "a100-80gb", 4, "ttft_ms", 1, 128, 1),
    ("llama-2-70b", "a100-80gb", 4, "ttft_ms", 1, 2048, 1),
    ("llama-7b", "l40s", 1, "ttft_ms", 1, 2048, 1),
    ("llama-7b", "h100-sxm", 1, "ttft_ms", 1, 2048, 1),
)


def release_speed(row: PublishedRow) -> float:
    """The packaged fit's speed of the engine release that measured ``row`` (1: the reference)."""
    return float(speeds(packaged_fit().meta["parameters"])[speed_of(row)])


def to_point(row: PublishedRow) -> MeasuredPoint:
    """A static-batch dataset row as a calibration point (the GPU's own efficiency and overhead apply, at
    the speed of the release that measured it)."""
    if row.mode != "static":
        raise ValueError(f"row {row.id}: only static-batch rows map to MeasuredPoint (mode {row.mode})")
    if not is_metric(row.metric):  # a loaded row always holds one (PublishedRow checks)
        raise ValueError(f"row {row.id}: unknown metric {row.metric!r}")
    return MeasuredPoint(
        model=row.model,
        gpu=row.gpu,
        metric=row.metric,
        value=row.value,
        batch=row.batch or 1,
        input_len=row.input_len,
        output_len=row.output_len,
        tp=row.tp,
        pp=row.pp,
        dtype=row.dtype,
        per_gpu=row.per_gpu,
        mem_fraction=TRT_MEM_FRACTION,
        source=row.source_url,
        speed=release_speed(row),
    )


def _key(r: PublishedRow) -> tuple:
    return (r.model, r.gpu, r.tp, r.metric, r.batch or 1, r.input_len, r.output_len)


def _table_rows() -> list[PublishedRow]:
    return [r for r in published_rows() if r.source_id in ("trtllm-v0.6.1", "trtllm-v0.5") and r.model != "gpt-j-6b"]


REFERENCE: tuple[MeasuredPoint, ...] = tuple(
    to_point(r) for k in _REFERENCE_KEYS for r in _table_rows() if _key(r) == k
)
HELD_OUT: tuple[MeasuredPoint, ...] = tuple(to_point(r) for r in _table_rows() if _key(r) not in _REFERENCE_KEYS)


class Comparison(TypedDict):
    """One point predicted vs published (a dict: tests and the docs' tables read it by key)."""

    point: MeasuredPoint
    predicted: float
    error_pct: float  # 100 * (predicted - published) / published


def compare(points: Sequence[MeasuredPoint], catalog: Catalog | None = None) -> list[Comparison]:
    """Predicted vs published for each point."""
    cat = catalog or builtin_catalog()
    rows = []
    for p in points:
        pred = predict_point(p, cat)
        rows.append(Comparison(point=p, predicted=pred, error_pct=100.0 * (pred - p.value) / p.value))
    return rows


def median_abs_error_pct(points: Sequence[MeasuredPoint], catalog: Catalog | None = None) -> float:
    return float(np.median([abs(r["error_pct"]) for r in compare(points, catalog)]))


def batch1_bandwidth_share(model: str, gpu: str, tp: int, dtype: str, catalog: Catalog | None = None) -> float:
    """Weight bytes per GPU / (batch-1 decode step time x peak bandwidth): the share hardware.md quotes."""
    cat = catalog or builtin_catalog()
    perf = replica_perf(cat.model(model), cat.gpu(gpu), tp, 1, dtype)
    step = float(perf.decode_step_time(1, 512))
    return perf.weights_gb_per_gpu * 1e9 / step / (cat.gpu(gpu).bandwidth_gbs * 1e9)


def _label(p: MeasuredPoint) -> str:
    if p.metric == "ttft_ms":
        return f"first token, {p.input_len} in"
    unit = "tok/s/GPU" if p.per_gpu and p.tp * p.pp > 1 else "tok/s"
    return f"batch {p.batch}, {p.input_len}/{p.output_len}, output {unit}"


def markdown_table(points: Sequence[MeasuredPoint], catalog: Catalog | None = None) -> str:
    """A markdown table of predicted vs published, with the median absolute error as the last line."""
    lines = [
        "| model | GPU | TP | dtype | what | published | predicted | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = compare(points, catalog)
    for r in rows:
        p = r["point"]
        unit = " ms" if p.metric == "ttft_ms" else ""
        lines.append(
            f"| {p.model} | {p.gpu} | {p.tp} | {p.dtype} | {_label(p)} | {p.value:,.0f}{unit} "
            f"| {r['predicted']:,.0f}{unit} | {r['error_pct']:+.1f}% |"
        )
    med = float(np.median([abs(r["error_pct"]) for r in rows]))
    lines.append("")
    lines.append(f"Median absolute error: {med:.1f}% over {len(rows)} rows.")
    return "\n".join(lines)


def main() -> None:
    """Print the measurements.md and held-out tables (markdown) for docs/perf-model.md."""
    sys.stdout.write("### Every row of measurements.md\n\n")
    sys.stdout.write(markdown_table(REFERENCE) + "\n\n")
    sys.stdout.write("### The other LLaMA rows of the same tables\n\n")
    sys.stdout.write(markdown_table(HELD_OUT) + "\n")


if __name__ == "__main__":
    main()
