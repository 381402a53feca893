"""Kernel-level calibration: time a catalog model's decoder layers in PyTorch (random weights) on a device.

Why: an engine sweep (``boute profile perf``) needs the model's weights and a serving engine on the GPU; a
bare GPU host with PyTorch can still tell how fast its GEMMs, attention and memory really are for a model's
shapes. This builds ``--layers`` Llama-style decoder layers with the catalog model's shapes (GQA attention
through ``scaled_dot_product_attention``, SwiGLU MLP, RMSNorm; rotary embeddings left out, a few percent of
a layer's time) plus the LM head, times prefill passes and decode steps with a KV cache, scales the layer
time to the model's depth, and fits the GPU type's efficiency factors on half of the points, reporting the
errors on the other half.

Approximate: no engine runtime (scheduler, sampling, CUDA graphs), so the fitted ``step_overhead_ms`` is
the bare kernels' and an engine sweep should refine it; a 1-byte dtype is not timed (bf16 only). On a CPU
the layers run in float32 (PyTorch's bf16 GEMMs there are ~150x slower than fp32 on AVX2, measured), which
makes a CPU run a check of this module, not a measurement of a bf16 deployment.

``python -m backends.profile.torch_layers --model llama-3.1-8b --gpu h100-sxm --device cuda --out cal.yaml``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from backends.profile.calibrate import compare
from boute.catalog import Catalog, ModelSpec
from boute.perf.calibration import MeasuredPoint, fit_efficiency

#: (batch, prompt tokens) of the prefill passes and (batch, context tokens) of the decode steps
PREFILL_GRID: tuple[tuple[int, int], ...] = ((1, 128), (1, 512), (1, 2048), (4, 512), (8, 1024), (16, 2048))
DECODE_GRID: tuple[tuple[int, int], ...] = ((1, 512), (8, 1024), (16, 2048), (32, 512), (64, 1024), (128, 2048))
QUICK_PREFILL: tuple[tuple[int, int], ...] = ((1, 32), (1, 64), (2, 64), (1, 128))
QUICK_DECODE: tuple[tuple[int, int], ...] = ((1, 64), (2, 128), (4, 64), (8, 128))


@dataclass(frozen=True)
class Timing:
    """One timed shape: ``phase`` prefill (``tokens`` per prompt) or decode (``tokens`` of context)."""

    phase: str
    batch: int
    tokens: int
    ms: float  # whole model: layers scaled to the model's depth, plus the LM head


def _dtype(device: str) -> Any:
    """bf16 on accelerators (what serving engines run), float32 on a CPU (see the module docstring)."""
    import torch

    return torch.float32 if device == "cpu" else torch.bfloat16


def _build(model: ModelSpec, n_layers: int, device: str) -> tuple[list[dict[str, Any]], Any, Any]:
    """Random weights of ``n_layers`` decoder layers, the final norm and the LM head."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    dt = _dtype(device)

    def w(*shape: int) -> Any:
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(dt)

    h, d, nq, nkv, f = model.hidden, model.head_dim, model.heads, model.kv_heads, model.ffn
    layers = [
        {
            "qkv": w(h, (nq + 2 * nkv) * d),
            "o": w(nq * d, h),
            "gate_up": w(h, 2 * f),
            "down": w(f, h),
            "n1": torch.ones(h, device=device, dtype=dt),
            "n2": torch.ones(h, device=device, dtype=dt),
        }
        for _ in range(n_layers)
    ]
    return layers, torch.ones(h, device=device, dtype=dt), w(h, model.vocab)


def _layer(model: ModelSpec, p: dict[str, Any], x: Any, kv: tuple[Any, Any] | None, pos: int) -> Any:
    """One decoder layer; ``kv`` (keys, values: [b, kv_heads, ctx + 1, d]) makes it a decode step at ``pos``."""
    import torch.nn.functional as F

    b, s, _ = x.shape
    d, nq, nkv = model.head_dim, model.heads, model.kv_heads
    y = F.rms_norm(x, (model.hidden,), p["n1"])
    q, k, v = (y @ p["qkv"]).split([nq * d, nkv * d, nkv * d], dim=-1)
    q = q.view(b, s, nq, d).transpose(1, 2)
    k = k.view(b, s, nkv, d).transpose(1, 2)
    v = v.view(b, s, nkv, d).transpose(1, 2)
    if kv is None:
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        keys, values = kv
        keys[:, :, pos : pos + 1] = k
        values[:, :, pos : pos + 1] = v
        a = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
    x = x + a.transpose(1, 2).reshape(b, s, nq * d) @ p["o"]
    gate, up = (F.rms_norm(x, (model.hidden,), p["n2"]) @ p["gate_up"]).chunk(2, dim=-1)
    return x + (F.silu(gate) * up) @ p["down"]


def _timer(device: str) -> Callable[[Callable[[], Any]], float]:
    """Median wall time (ms) of a callable after warm-up, synchronising the device around each call."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def timed(fn: Callable[[], Any], repeats: int = 5, warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        sync()
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            sync()
            out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)

    return timed


def time_model(
    model: ModelSpec,
    *,
    device: str = "cuda",
    n_layers: int | None = None,
    prefill: Sequence[tuple[int, int]] = PREFILL_GRID,
    decode: Sequence[tuple[int, int]] = DECODE_GRID,
    repeats: int = 5,
) -> list[Timing]:
    """Time prefill passes and decode steps of ``model``'s shapes; layer time is scaled to its full depth."""
    import torch

    n = min(model.layers, n_layers or model.layers)
    layers, norm, head = _build(model, n, device)
    dt = _dtype(device)
    timed = _timer(device)
    scale = model.layers / n
    out: list[Timing] = []
    with torch.inference_mode():
        for b, s in prefill:
            x = torch.randn(b, s, model.hidden, device=device, dtype=dt)

            def run_layers(x: Any = x) -> Any:
                for p in layers:
                    x = _layer(model, p, x, None, 0)
                return x

            # the LM head only scores the last position of each prompt (what engines do in prefill)
            last = x[:, -1:, :]
            t_head = timed(lambda last=last: torch.nn.functional.rms_norm(last, (model.hidden,), norm) @ head, repeats)
            out.append(Timing("prefill", b, s, timed(run_layers, repeats) * scale + t_head))
        for b, c in decode:
            kv_shape = (b, model.kv_heads, c + 1, model.head_dim)
            caches = [
                (
                    torch.randn(kv_shape, device=device, dtype=dt),
                    torch.randn(kv_shape, device=device, dtype=dt),
                )
                for _ in layers
            ]
            x = torch.randn(b, 1, model.hidden, device=device, dtype=dt)

            def step_layers(x: Any = x, caches: list = caches, c: int = c) -> Any:
                for p, kv in zip(layers, caches, strict=True):
                    x = _layer(model, p, x, kv, c)
                return x

            # layers and head timed apart, as in prefill: the layers' time is never the difference of two
            # noisy medians (on a loaded CPU that difference went negative)
            t_layers = timed(step_layers, repeats)
            t_head = timed(lambda x=x: torch.nn.functional.rms_norm(x, (model.hidden,), norm) @ head, repeats)
            out.append(Timing("decode", b, c, t_layers * scale + t_head))
            del caches
    return out


def to_points(timings: Sequence[Timing], model: str, gpu: str) -> list[MeasuredPoint]:
    """Timings as the calibration's measured points: prefill -> TTFT, decode step -> TPOT at that context."""
    pts = []
    for t in timings:
        if t.phase == "prefill":
            pts.append(MeasuredPoint(model, gpu, "ttft_ms", t.ms, batch=t.batch, input_len=t.tokens, output_len=2))
        else:  # a static batch's TPOT averages its steps; two steps at this context is the closest shape
            pts.append(MeasuredPoint(model, gpu, "tpot_ms", t.ms, batch=t.batch, input_len=t.tokens, output_len=2))
    return pts


def calibrate(points: Sequence[MeasuredPoint], catalog: Catalog, gpu: str) -> dict[str, Any]:
    """Fit on every other point, report predicted-vs-measured errors on the rest, before and after."""
    fit_pts, held = list(points[::2]), list(points[1::2])
    result = fit_efficiency(fit_pts, catalog, gpu)
    before, after = compare(held, catalog), compare(held, catalog, result.efficiency)
    return {
        "fitted": list(result.fitted),
        "efficiency": result.efficiency.model_dump(exclude_none=True),
        "held_out_median_abs_error_pct_before": statistics.median(abs(r["error_pct"]) for r in before),
        "held_out_median_abs_error_pct_after": statistics.median(abs(r["error_pct"]) for r in after),
        "held_out_max_abs_error_pct_after": max(abs(r["error_pct"]) for r in after),
        "held_out_before": before,
        "held_out_after": after,
        "result": result,
    }


def main(argv: list[str] | None = None) -> int:
    from boute.catalog import builtin_catalog, load_catalog_file
    from boute.errors import BouteError
    from boute.perf.calibration import save_calibration

    ap = argparse.ArgumentParser(prog="python -m backends.profile.torch_layers", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b", help="catalog model whose shapes are timed")
    ap.add_argument("--gpu", required=True, help="catalog GPU type this device is (factors are fitted for it)")
    ap.add_argument("--device", default="cuda", help="torch device (cuda, cuda:1, cpu)")
    ap.add_argument("--layers", type=int, default=None, help="layers built and timed (default: all)")
    ap.add_argument("--catalog", type=Path, default=None, help="extra GPU/model catalog YAML")
    ap.add_argument("--quick", action="store_true", help="small shapes (a CPU smoke run)")
    ap.add_argument("--out", type=Path, required=True, help="calibration file to write")
    ap.add_argument("--results", type=Path, default=None, help="timings and errors as JSON")
    args = ap.parse_args(argv)
    try:
        cat = load_catalog_file(args.catalog) if args.catalog else builtin_catalog()
        model, _ = cat.model(args.model), cat.gpu(args.gpu)
    except (KeyError, BouteError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    grids = (QUICK_PREFILL, QUICK_DECODE) if args.quick else (PREFILL_GRID, DECODE_GRID)
    timings = time_model(model, device=args.device, n_layers=args.layers, prefill=grids[0], decode=grids[1])
    report = calibrate(to_points(timings, args.model, args.gpu), cat, args.gpu)
    save_calibration(args.out, {args.gpu: report.pop("result").efficiency})
    doc = {"model": args.model, "gpu": args.gpu, "device": args.device, "timings": [asdict(t) for t in timings]}
    doc.update(report)
    text = json.dumps(doc, indent=2, default=float)
    if args.results:
        args.results.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
