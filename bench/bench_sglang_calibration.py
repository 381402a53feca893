"""Calibration on real SGLang (issue 30): the performance model's error on held-out request shapes, before and
after ``boute profile perf`` fits it to one real SGLang replica on this CPU (``make sglang``).

The replica is SmolLM2-135M (bf16) on SGLang's CPU engine. The model has no "GPU type" for SGLang on a CPU;
the catalog of the llama.cpp engine (``backends/llamacpp/catalog.yaml``) describes this very CPU (its SIMD
peaks and measured memory bandwidth) and this very model, so its ``cpu-llamacpp`` type with dtype bf16 is what
the model predicts for this replica uncalibrated ("before"). ``boute profile perf`` (the CLI, as a user runs
it) sweeps a small grid and writes the calibration file; the held-out shapes are then drawn at random (prompt
and answer lengths uniform, concurrency from a few levels; never a grid point) and measured on the same
replica. Every figure is approximate: 2 shared, busy cores.

Why SGLang is not ``max_batch`` 1 here (unlike llama.cpp): it batches the decode of concurrent requests, so
concurrency-c points give TPOT at batch c; TTFT is fitted as one prompt's prefill, which at c > 1 also
carries the wait behind the other requests' prefill (a known bias of the replica model, reported as is).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "backends" / "llamacpp" / "catalog.yaml"
MODEL, GPU, DTYPE = "smollm2-135m", "cpu-llamacpp", "bf16"
SERVED = "smollm2-135m"
#: what ``boute profile perf`` sweeps (the fit); the held-out shapes are drawn, never from this grid
FIT_CONCURRENCY, FIT_INPUTS, FIT_OUTPUTS = "1,2", "32,384", "12"
HELD_OUT_CONCURRENCY = (1, 2, 3)


def held_out_shapes(n: int, seed: int) -> list[tuple[int, int, int]]:
    """``n`` (concurrency, prompt tokens, answer tokens) drawn at random: prompts 16-512, answers 6-20."""
    rng = np.random.default_rng(seed)
    fit_in = {int(x) for x in FIT_INPUTS.split(",")}
    out = []
    while len(out) < n:
        i = int(rng.integers(16, 513))
        if i in fit_in:
            continue
        out.append((int(rng.choice(HELD_OUT_CONCURRENCY)), i, int(rng.integers(6, 21))))
    return out


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric in ("ttft_ms", "tpot_ms"):
        errs = [abs(r["error_pct"]) for r in rows if r["metric"] == metric]
        if errs:
            out[metric] = {
                "median_abs_error_pct": round(statistics.median(errs), 1),
                "max_abs_error_pct": round(max(errs), 1),
                "points": len(errs),
            }
    return out


def run(quick: bool = False, seed: int = 30, n_held_out: int | None = None) -> dict[str, Any]:
    from backends.llamacpp import llamacpp_catalog
    from backends.profile.calibrate import MeasuredReplica, compare, measured_points
    from backends.profile.loadgen import LoadPoint, run_sweep
    from backends.sglang.cpu import server_install, start_cpu_replica
    from boute.errors import BouteError
    from boute.perf.calibration import apply_calibration, load_calibration
    from tests.services import free_port

    try:
        server_install()
    except BouteError as exc:
        return {"skipped": str(exc)}
    n = n_held_out or (4 if quick else 6)
    shapes = held_out_shapes(n, seed)
    cat = llamacpp_catalog()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        replica = start_cpu_replica(free_port(), t / "server.log", served_model_name=SERVED)
        try:
            t0 = time.monotonic()
            cmd = [sys.executable, "-m", "boute.cli.main", "profile", "perf", "--endpoint", replica.url]
            cmd += ["--model", MODEL, "--gpu", GPU, "--dtype", DTYPE, "--served-model", SERVED]
            cmd += ["--catalog", str(CATALOG), "--concurrency", FIT_CONCURRENCY, "--input", FIT_INPUTS]
            cmd += ["--output", FIT_OUTPUTS, "--requests", "2", "--out", str(t / "cal.yaml")]
            cmd += ["--db", f"sqlite:///{t / 'boute.db'}", "--json"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
            if done.returncode != 0:
                raise RuntimeError(f"boute profile perf failed: {done.stderr.strip()[-500:]}")
            profile = json.loads(done.stdout)
            profile_s = time.monotonic() - t0
            calibration_yaml = (t / "cal.yaml").read_text()
            calibrated = apply_calibration(cat, load_calibration(t / "cal.yaml"))
            t1 = time.monotonic()
            points = [LoadPoint(c, i, o, requests=max(2, c)) for c, i, o in shapes]
            # ignore_eos (SGLang's sampling parameter): each answer is as long as drawn, not cut by an early EOS
            swept = run_sweep(replica.url, SERVED, points, api="chat", extra={"ignore_eos": True})
            held_s = time.monotonic() - t1
        finally:
            replica.stop()
    held = measured_points(swept, MeasuredReplica(model=MODEL, gpu=GPU, dtype=DTYPE), "held-out")
    before, after = compare(held, cat), compare(held, calibrated)
    return {
        "engine": "SGLang 0.5.23 CPU engine (torch_native attention), SmolLM2-135M-Instruct bf16, 2 shared cores",
        "catalog_before": f"{CATALOG.relative_to(ROOT)} ({GPU}, {MODEL}, {DTYPE}): uncalibrated factors",
        "profile_perf": {
            "command": "boute profile perf --endpoint URL --model smollm2-135m --gpu cpu-llamacpp --dtype bf16 "
            f"--catalog backends/llamacpp/catalog.yaml --concurrency {FIT_CONCURRENCY} --input {FIT_INPUTS} "
            f"--output {FIT_OUTPUTS} --requests 2",
            "wall_s": round(profile_s, 1),
            "efficiency": profile.get("efficiency"),
            "fitted": profile.get("fitted"),
            "fit_points_median_abs_error_pct_before": profile.get("median_abs_error_pct_before"),
            "fit_points_median_abs_error_pct_after": profile.get("median_abs_error_pct_after"),
            "points": profile.get("points"),
        },
        "calibration_file": calibration_yaml,
        "held_out_seed": seed,
        "held_out_shapes": [{"concurrency": c, "input": i, "output": o} for c, i, o in shapes],
        "held_out_wall_s": round(held_s, 1),
        "held_out_failed_requests": sum(r.failed for r in swept),
        "held_out_before": _summary(before),
        "held_out_after": _summary(after),
        "held_out_rows_before": before,
        "held_out_rows_after": after,
    }
