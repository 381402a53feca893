"""Published serving measurements as data, and the performance model's predictions for them.

The rows of ``../shared/reference/measurements.md`` come from NVIDIA's TensorRT-LLM performance tables
(``docs/source/performance.md`` of NVIDIA/TensorRT-LLM, v0.6.1 for peak throughput, v0.5 for the L40S
throughput and all first-token latencies). They are static-batch anchors, not continuous-batching serving
runs, so they check the roofline (compute, bandwidth, overhead, TP cost), not the scheduler.

``HELD_OUT`` holds the other LLaMA rows of the same tables: the packaged efficiency factors were fitted
on ``REFERENCE`` only, so the error on ``HELD_OUT`` says how well the factors transfer.

Run ``python -m boute.perf.measurements`` to print the markdown table used in docs/perf-model.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from boute.catalog import Catalog, Efficiency, builtin_catalog
from boute.perf.calibration import MeasuredPoint, fit_efficiency, predict_point
from boute.perf.model import replica_perf

_SRC_061 = "NVIDIA/TensorRT-LLM docs/source/performance.md, v0.6.1 peak-throughput table"
_SRC_05 = "NVIDIA/TensorRT-LLM docs/source/performance.md, v0.5 table"
#: TensorRT-LLM static engines pre-allocate nearly all device memory (not SGLang's 0.88)
TRT_MEM_FRACTION = 0.98


def _thr(
    model: str, gpu: str, tp: int, dtype: str, batch: int, i: int, o: int, value: float, src: str
) -> MeasuredPoint:
    # v0.6.1 tables report output tokens/s per GPU (stated on the H100 table; the A100 LLaMA-70B TP4 row,
    # 670, is only consistent with per GPU: 2,680 tok/s in total). Per GPU == total for TP1 rows.
    return MeasuredPoint(
        model=model,
        gpu=gpu,
        metric="output_tokens_per_s",
        value=value,
        batch=batch,
        input_len=i,
        output_len=o,
        tp=tp,
        dtype=dtype,
        per_gpu=src == _SRC_061,
        mem_fraction=TRT_MEM_FRACTION,
        source=src,
    )


def _ttft(model: str, gpu: str, tp: int, dtype: str, i: int, value: float) -> MeasuredPoint:
    return MeasuredPoint(
        model=model,
        gpu=gpu,
        metric="ttft_ms",
        value=value,
        batch=1,
        input_len=i,
        output_len=1,
        tp=tp,
        dtype=dtype,
        mem_fraction=TRT_MEM_FRACTION,
        source=_SRC_05 + " (low latency, batch 1)",
    )


#: every row of ../shared/reference/measurements.md ("LLaMA-70B" is Llama-2-70B; FP16 runs as bf16)
REFERENCE: tuple[MeasuredPoint, ...] = (
    _thr("llama-7b", "h100-sxm", 1, "fp8", 768, 128, 128, 19694, _SRC_061),
    _thr("llama-7b", "a100-80gb", 1, "bf16", 384, 128, 128, 5586, _SRC_061),
    _thr("llama-7b", "a100-80gb", 1, "bf16", 60, 128, 2048, 1928, _SRC_061),
    _thr("llama-2-70b", "a100-80gb", 4, "bf16", 1280, 128, 128, 670, _SRC_061),
    _thr("llama-7b", "l40s", 1, "fp8", 64, 128, 128, 3240, _SRC_05),
    _ttft("llama-7b", "a100-80gb", 1, "bf16", 128, 16),
    _ttft("llama-7b", "a100-80gb", 1, "bf16", 2048, 133),
    _ttft("llama-2-70b", "a100-80gb", 4, "bf16", 128, 47),
    _ttft("llama-2-70b", "a100-80gb", 4, "bf16", 2048, 377),
    _ttft("llama-7b", "l40s", 1, "fp8", 2048, 73),
    _ttft("llama-7b", "h100-sxm", 1, "fp8", 2048, 36),
)

#: the other LLaMA rows of the same tables, never used for fitting
HELD_OUT: tuple[MeasuredPoint, ...] = (
    _thr("llama-7b", "h100-sxm", 1, "fp8", 112, 128, 2048, 6818, _SRC_061),
    _thr("llama-7b", "h100-sxm", 1, "fp8", 80, 2048, 128, 2244, _SRC_061),
    _thr("llama-7b", "h100-sxm", 1, "fp8", 48, 2048, 2048, 2740, _SRC_061),
    _thr("llama-2-70b", "h100-sxm", 2, "fp8", 1024, 128, 128, 2657, _SRC_061),
    _thr("llama-2-70b", "h100-sxm", 4, "fp8", 480, 128, 2048, 1486, _SRC_061),
    _thr("llama-2-70b", "h100-sxm", 2, "fp8", 96, 2048, 128, 306, _SRC_061),
    _thr("llama-2-70b", "h100-sxm", 2, "fp8", 64, 2048, 2048, 547, _SRC_061),
    _thr("llama-7b", "l40s", 1, "fp8", 64, 128, 2048, 1622, _SRC_05),
    _thr("llama-7b", "l40s", 1, "fp8", 32, 2048, 128, 581, _SRC_05),
    _thr("llama-7b", "l40s", 1, "fp8", 16, 2048, 2048, 531, _SRC_05),
    _thr("llama-7b", "a100-80gb", 1, "bf16", 52, 2048, 128, 591, _SRC_061),
    _thr("llama-7b", "a100-80gb", 2, "bf16", 64, 2048, 2048, 782, _SRC_061),
    _thr("llama-2-70b", "a100-80gb", 4, "bf16", 240, 128, 2048, 525, _SRC_061),
    _thr("llama-2-70b", "a100-80gb", 4, "bf16", 120, 2048, 128, 79, _SRC_061),
    _ttft("llama-7b", "h100-sxm", 1, "fp8", 128, 7),
    _ttft("llama-2-70b", "h100-sxm", 4, "fp8", 128, 26),
    _ttft("llama-2-70b", "h100-sxm", 4, "fp8", 2048, 109),
    _ttft("llama-7b", "l40s", 1, "fp8", 128, 14),
)


def compare(points: Sequence[MeasuredPoint], catalog: Catalog | None = None) -> list[dict[str, object]]:
    """Predicted vs published for each point; ``error_pct`` = 100 * (predicted - published) / published."""
    cat = catalog or builtin_catalog()
    rows = []
    for p in points:
        pred = predict_point(p, cat)
        rows.append({"point": p, "predicted": pred, "error_pct": 100.0 * (pred - p.value) / p.value})
    return rows


def median_abs_error_pct(points: Sequence[MeasuredPoint], catalog: Catalog | None = None) -> float:
    return float(np.median([abs(float(r["error_pct"])) for r in compare(points, catalog)]))  # type: ignore[arg-type]


#: GPUs with published rows, fitted in this order: A100 first (most rows, the only TP>1 rows), then the
#: others start from its step overhead and link factor, which their TP1 rows barely inform
FITTED_GPUS: tuple[str, ...] = ("a100-80gb", "h100-sxm", "l40s")


def fit_packaged_factors(catalog: Catalog | None = None) -> dict[str, Efficiency]:
    """Re-fit the packaged factors of :data:`FITTED_GPUS` on :data:`REFERENCE` from neutral start values.

    This is how the ``efficiency`` entries of those GPUs in ``boute/catalog/gpus.yaml`` were made; a test
    checks the file still matches it.
    """
    cat = catalog or builtin_catalog()
    out: dict[str, Efficiency] = {}
    first = fit_efficiency(REFERENCE, cat, FITTED_GPUS[0], start=Efficiency()).efficiency
    out[FITTED_GPUS[0]] = first
    for gpu in FITTED_GPUS[1:]:
        start = Efficiency(link=first.link, step_overhead_ms=first.step_overhead_ms)
        out[gpu] = fit_efficiency(REFERENCE, cat, gpu, start=start).efficiency
    return out


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
        p: MeasuredPoint = r["point"]  # type: ignore[assignment]
        unit = " ms" if p.metric == "ttft_ms" else ""
        lines.append(
            f"| {p.model} | {p.gpu} | {p.tp} | {p.dtype} | {_label(p)} | {p.value:,.0f}{unit} "
            f"| {float(r['predicted']):,.0f}{unit} | {float(r['error_pct']):+.1f}% |"  # type: ignore[arg-type]
        )
    med = float(np.median([abs(float(r["error_pct"])) for r in rows]))  # type: ignore[arg-type]
    lines.append("")
    lines.append(f"Median absolute error: {med:.1f}% over {len(rows)} rows.")
    return "\n".join(lines)


def main() -> None:
    """Print the reference and held-out tables (markdown) for docs/perf-model.md."""
    sys.stdout.write("### Every row of measurements.md (fitted on these)\n\n")
    sys.stdout.write(markdown_table(REFERENCE) + "\n\n")
    sys.stdout.write("### Held-out rows of the same tables (not used for fitting)\n\n")
    sys.stdout.write(markdown_table(HELD_OUT) + "\n")


if __name__ == "__main__":
    main()
