"""Router scoring cost per prompt on one core, and held-out APGR, for each way of making it fast (issue 11).

Goal: p50 <= 1 ms and p99 <= 3 ms per prompt on one core (a gateway core must route 100+ req/s), with
held-out APGR on GSM8K and MT-Bench within 0.01 of today's MiniLM router (or better).

Options, all on the same prompts (GSM8K + MT-Bench, evenly spaced), timed in interleaved rounds so a burst
of load from other jobs hits every option alike; the process (and a pool worker) is pinned to one core and
torch / ONNX Runtime run one thread. Per prompt: wall time and CPU time (process time, all threads: on a
shared machine the wall-clock tail is mostly waiting for the core; the CPU time is what scoring costs).

- ``minilm``: today's router, MiniLM in torch, one prompt at a time;
- ``minilm_onnx_int8``: MiniLM exported to ONNX, weights dynamically quantised to int8 (ONNX Runtime);
- ``minilm_microbatch_{8,32}``: concurrent requests scored together; a request's latency is its batch's
  time (a lower bound: the wait for the batch to fill is not counted), its CPU the batch's / size;
- ``minilm_process_pool``: scoring in a one-worker process pool on the same core (frees the event loop,
  not the CPU; adds the IPC round trip);
- ``static``: token vectors distilled from MiniLM by model2vec (``boute router train --embedder static``).

APGR: each option's router trained on its own embeddings, on the seed-0 split, held-out queries scored as
``boute router eval`` does (GSM8K: 30 % = 396 queries; MT-Bench: 50 % = 80 turns as in bench_quality, and
30 % = 48 turns, the CLI default), with a paired bootstrap interval of (option - MiniLM) over the
held-out queries, and the mean over seeded splits 0-4.

This module runs the comparison; the timing helpers are in ``bench.router_timing``, the ONNX model in
``bench.router_onnx`` and the APGR side in ``bench.router_apgr``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.router_apgr import PRIMARY, PROFILES, TIERS, held_out_apgr
from bench.router_onnx import OnnxMiniLM
from bench.router_timing import batched, per_prompt, pin_one_core, pool_init, pool_score, sample_prompts, timing_stats

GOAL = {"p50_ms": 1.0, "p99_ms": 3.0, "apgr_within": 0.01}


def _light_load(router_path: Path) -> dict[str, Any]:
    """Load + score a static router in a fresh interpreter: time and whether torch got imported."""
    code = (
        "import sys, time; t0 = time.perf_counter()\n"
        "from boute.quality import load_router\n"
        f"r = load_router({str(router_path)!r}); r.score_one('How many apples are left?')\n"
        "print(time.perf_counter() - t0, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return {"import_load_score_s": round(float(out[0]), 3), "torch_imported": out[1] == "True"}


def _onnx_info(onnx: OnnxMiniLM, embs: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    """Build cost and how close the int8 embeddings stay to torch's (cosine per prompt)."""
    cos = np.concatenate([np.sum(e["minilm"] * e["minilm_onnx_int8"], axis=1) for e in embs.values()])
    return {
        "build_s": round(onnx.build_s, 1),
        "int8_mb": round(onnx.size_mb, 1),
        "cosine_to_torch_mean": round(float(cos.mean()), 4),
        "cosine_to_torch_min": round(float(cos.min()), 4),
    }


# ------------------------------------------------------------------------------------------------ run
def run(quick: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-router-speed-") as tmp:  # ONNX files: ~110 MB
        return _run(quick, Path(tmp))


def _run(quick: bool, workdir: Path) -> dict[str, Any]:
    load_before = os.getloadavg()
    cpu = max(os.sched_getaffinity(0))
    pin_one_core(cpu)
    from boute.quality.embed import Embedder
    from boute.quality.head import shape_row
    from boute.quality.profiles import load_profile
    from boute.quality.router import train_router
    from boute.quality.static_embed import StaticSettings, load_static, static_dir

    t0 = time.perf_counter()
    static = load_static()  # distils on first use on this machine (minutes), then reads the cache
    static_load_s = time.perf_counter() - t0
    profs = {k: load_profile(n) for k, (n, _) in PROFILES.items()}
    embs: dict[str, dict[str, np.ndarray]] = {k: {} for k in PROFILES}
    for k, p in profs.items():
        embs[k]["minilm"] = Embedder().embed(p.prompts)
        embs[k]["static"] = static.embed(p.prompts)
    onnx: OnnxMiniLM | None = None
    onnx_note = None
    try:
        onnx = OnnxMiniLM(workdir)
        for k, p in profs.items():
            embs[k]["minilm_onnx_int8"] = onnx.embed_all(list(p.prompts))
    except ImportError as exc:
        onnx_note = f"skipped: {exc} (pip install onnxruntime onnx to measure it)"

    # routers for timing: trained on GSM8K (seed 0), the gateway's reference profile
    g = profs["gsm8k"]
    minilm_router, _, _ = train_router(g, TIERS, embs["gsm8k"]["minilm"])
    static_router, _, _ = train_router(g, TIERS, embs["gsm8k"]["static"], static=static)
    minilm_path = minilm_router.save(workdir / "minilm.npz")
    static_path = static_router.save(workdir / "static.npz")
    options: dict[str, Any] = {
        "minilm": lambda p: minilm_router.score_one(p),
        "static": lambda p: static_router.score_one(p),
    }
    if onnx is not None:
        onnx_router, _, _ = train_router(g, TIERS, embs["gsm8k"]["minilm_onnx_int8"])
        w = onnx_router

        def onnx_one(p: str) -> float:
            return float(w.score_embeddings(onnx.embed([p]), [p])[0])

        options["minilm_onnx_int8"] = onnx_one
    pool = ProcessPoolExecutor(1, initializer=pool_init, initargs=(str(minilm_path), cpu))
    pool.submit(pool_score, "warm").result()
    options["minilm_process_pool"] = lambda p: pool.submit(pool_score, p).result()
    minilm_settings = minilm_router.metadata["embedder"]

    def microbatch(size: int) -> Any:
        """Score a batch as concurrent requests would be: the model runs, no disk cache."""
        enc = Embedder(batch_size=size, max_tokens=minilm_settings["max_tokens"], truncate=minilm_settings["truncate"])
        return lambda chunk: minilm_router.score_embeddings(enc.encode(chunk), chunk)

    prompts = sample_prompts(24, 8) if quick else sample_prompts(120, 40)
    rounds = 2 if quick else 3
    for fn in options.values():  # warm-up: first calls load models, fill caches
        per_prompt(fn, prompts[:3])
    names = [*options, "minilm_microbatch_8", "minilm_microbatch_32"]
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu_ms: dict[str, list[float]] = {k: [] for k in names}
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        for name in order:
            if name.startswith("minilm_microbatch_"):
                size = int(name.rsplit("_", 1)[1])
                w_, c_ = batched(microbatch(size), prompts, size)
            else:
                w_, c_ = per_prompt(options[name], prompts)
            wall[name] += w_
            cpu_ms[name] += c_
    pool.shutdown()
    # static on every GSM8K + MT-Bench prompt (cheap), for a p99 from ~1.5k samples
    all_prompts = list(profs["gsm8k"].prompts) + list(profs["mt_bench"].prompts)
    static_all = timing_stats(*per_prompt(options["static"], all_prompts))
    shape_only = timing_stats(*per_prompt(shape_row, all_prompts))
    embed_only = timing_stats(*per_prompt(static.embed_one, all_prompts))
    c1, t1 = time.process_time(), time.perf_counter()
    static_router.score(all_prompts)
    static_batch = {
        "wall_ms_per_prompt": round((time.perf_counter() - t1) * 1e3 / len(all_prompts), 4),
        "cpu_ms_per_prompt": round((time.process_time() - c1) * 1e3 / len(all_prompts), 4),
        "n": len(all_prompts),
    }

    speed: dict[str, Any] = {name: timing_stats(wall[name], cpu_ms[name]) for name in names}
    for size in (8, 32):
        speed[f"minilm_microbatch_{size}"]["note"] = (
            "latency = the batch's compute time (waiting for the batch to fill is extra); CPU = batch / size"
        )
    speed["minilm_process_pool"]["note"] = "CPU = the worker's; wall adds the IPC round trip"
    for r in speed.values():
        r["meets_speed_goal_cpu"] = r["cpu_p50_ms"] <= GOAL["p50_ms"] and r["cpu_p99_ms"] <= GOAL["p99_ms"]
        r["meets_speed_goal_wall"] = r["p50_ms"] <= GOAL["p50_ms"] and r["p99_ms"] <= GOAL["p99_ms"]
        r["prompts_per_s_per_core"] = round(1000.0 / r["cpu_ms_per_prompt"], 1)

    seeds = [0] if quick else [0, 1, 2, 3, 4]
    quality = held_out_apgr(embs, static, workdir, seeds)
    for name, r in speed.items():
        base = "minilm_onnx_int8" if name == "minilm_onnx_int8" else ("static" if name == "static" else "minilm")
        r["apgr_seed0"] = {k: quality[k]["options"][base]["apgr_seed0"] for k in PROFILES}
        r["meets_quality_goal"] = all(
            quality[k]["options"][base]["delta_seed0"] >= -GOAL["apgr_within"] for k in PRIMARY
        )
    # speed judged on CPU time: the wall-clock tail on this shared 2-core machine is other jobs' load
    ok = [n for n, r in speed.items() if r["meets_speed_goal_cpu"] and r["meets_quality_goal"]]
    choice = min(ok, key=lambda n: speed[n]["cpu_ms_per_prompt"]) if ok else None
    fast = [n for n, r in speed.items() if r["meets_speed_goal_cpu"]]
    q = {k: quality[k]["options"].get("static", {}) for k in PROFILES}
    st, mi = speed["static"], speed["minilm"]
    why = (
        f"options meeting the speed goal (CPU time per prompt): {', '.join(fast) or 'none'}; "
        f"static CPU p50/p99 {st['cpu_p50_ms']}/{st['cpu_p99_ms']} ms (wall {st['p50_ms']}/{st['p99_ms']} ms) vs "
        f"MiniLM {mi['cpu_p50_ms']}/{mi['cpu_p99_ms']} ms; APGR delta vs MiniLM, seed 0: "
        + ", ".join(f"{k} {q[k].get('delta_seed0')} (95% CI {q[k].get('delta_seed0_95ci')})" for k in PROFILES)
        + "; mean over seeds: "
        + ", ".join(f"{k} {q[k].get('delta_mean_seeds')}" for k in PROFILES)
    )
    settings = StaticSettings()
    table = static_dir(settings) / "table.npy"
    return {
        "goal": GOAL,
        "machine": {
            "cores_visible": os.cpu_count(),
            "pinned_to_cpu": cpu,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "prompts": {"n": len(prompts), "rounds": rounds, "gsm8k_and_mt_bench": True},
        "speed": speed,
        "static_detail": {
            "all_prompts_per_prompt": static_all,
            "shape_features_only": shape_only,
            "static_embedding_only": embed_only,
            "batched": static_batch,
            "table": {
                "path": str(table),
                "shape": list(static.table.shape),
                "mb": round(table.stat().st_size / 1e6, 1),
            },
            "settings": static.info.get("settings"),
            "distill_s": static.info.get("distill_seconds"),
            "load_or_distill_s_this_run": round(static_load_s, 2),
            "fresh_process": _light_load(static_path),
        },
        "onnx": _onnx_info(onnx, embs) if onnx else onnx_note,
        "quality": quality,
        "choice": choice,
        "why": why,
    }


if __name__ == "__main__":
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
