"""Timing router scoring per prompt on one pinned core, for ``bench_router_speed``.

The measuring helpers apart from the benchmark's choices: the process (and the pool worker that scores in a
separate process) pinned to one core with one thread per library, and per prompt both wall time and CPU time
(on a shared machine the wall-clock tail is mostly waiting for the core; the CPU time is what scoring costs).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

_POOL_ROUTER: Any = None  # the pool worker's router (module level: workers are separate processes)


def pin_one_core(cpu: int) -> None:
    """This process on one core, one thread per library: per-prompt CPU cost, not parallel speed-up."""
    os.sched_setaffinity(0, {cpu})
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import torch

    torch.set_num_threads(1)


def pool_init(path: str, cpu: int) -> None:
    global _POOL_ROUTER
    pin_one_core(cpu)
    from boute.quality.router import load_router

    _POOL_ROUTER = load_router(path)
    _POOL_ROUTER.score_one("warm up")


def pool_score(prompt: str) -> tuple[float, int]:
    """(score, the worker's CPU nanoseconds for it): the main process only waits, the worker computes."""
    t0 = time.thread_time_ns()
    s = float(_POOL_ROUTER.score_one(prompt))
    return s, time.thread_time_ns() - t0


def sample_prompts(n_gsm: int, n_mt: int) -> list[str]:
    from boute.quality.profiles import load_profile

    out: list[str] = []
    for name, n in (("builtin:gsm8k", n_gsm), ("builtin:mt-bench", n_mt)):
        ps = load_profile(name).prompts
        out += [ps[i] for i in np.linspace(0, len(ps) - 1, n).astype(int)]
    return out


def per_prompt(fn: Any, prompts: list[str]) -> tuple[list[float], list[float]]:
    """(wall ms, CPU ms) per prompt. CPU = this process's time (every thread: one core, one thread each)
    plus any CPU nanoseconds ``fn`` returns for work done elsewhere (the pool worker). Wall time also
    counts the waits while other jobs hold the core; CPU time is the cost of the scoring itself."""
    wall, cpu = [], []
    for p in prompts:
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        r = fn(p)
        t1, c1 = time.perf_counter_ns(), time.process_time_ns()
        extra = r[1] if isinstance(r, tuple) else 0
        wall.append((t1 - t0) / 1e6)
        cpu.append((c1 - c0 + extra) / 1e6)
    return wall, cpu


def batched(fn: Any, prompts: list[str], size: int) -> tuple[list[float], list[float]]:
    """Micro-batching: (wall ms of each request = its batch's time, CPU ms per request = batch CPU / size)."""
    wall, cpu = [], []
    for s in range(0, len(prompts), size):
        chunk = prompts[s : s + size]
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        fn(chunk)
        t1, c1 = time.perf_counter_ns(), time.process_time_ns()
        wall += [(t1 - t0) / 1e6] * len(chunk)
        cpu += [(c1 - c0) / 1e6 / len(chunk)] * len(chunk)
    return wall, cpu


def timing_stats(wall: list[float], cpu: list[float]) -> dict[str, Any]:
    w, c = np.asarray(wall), np.asarray(cpu)
    p = lambda a, q: round(float(np.percentile(a, q)), 3)  # noqa: E731
    return {
        "p50_ms": p(w, 50),
        "p99_ms": p(w, 99),
        "cpu_p50_ms": p(c, 50),
        "cpu_p99_ms": p(c, 99),
        "cpu_ms_per_prompt": round(float(c.mean()), 3),
        "n": len(w),
    }
