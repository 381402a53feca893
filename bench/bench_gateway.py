"""Gateway overhead and throughput vs calling the backend directly and vs sglang-router (Rust).

Setup (one machine, everything shares its CPUs, so figures include contention with the load generator
and the backend): one emulated llama-3.1-8b/H100 replica at a large speedup and 4-token answers, so the
backend's modelled time is small and proxy cost dominates. Three targets with the same closed-loop load:
the backend directly, the BOute gateway (one uvicorn worker), sglang-router. Overhead is reported two
ways: the gateway's own ``x-boute-overhead-ms`` header, and end-to-end latency minus the direct latency
at the same concurrency (includes client-side and kernel costs, and CPU contention).
Goals (issue 5): overhead p50 < 1 ms and p99 < 5 ms at 50 and 200 clients; no RSS growth over a soak.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np

from router.testing import Stack, free_port, wait_http

PLAN = {
    "routing": {"mode": "preroute", "tiers": ["small"], "fractions": [1.0]},
    "deployment": [{"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 1}],
}
BODY = {"model": "boute", "messages": [{"role": "user", "content": "bench"}], "max_tokens": 4}


async def _closed_loop(url: str, concurrency: int, n_requests: int | None, seconds: float | None) -> dict[str, Any]:
    import aiohttp

    lat: list[float] = []
    over: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds if seconds else None
    remaining = [n_requests or 0]
    conn = aiohttp.TCPConnector(limit=concurrency + 8)
    async with aiohttp.ClientSession(connector=conn) as s:

        async def worker() -> None:
            nonlocal errors
            while (deadline and time.perf_counter() < deadline) or (not deadline and remaining[0] > 0):
                remaining[0] -= 1
                t0 = time.perf_counter()
                try:
                    async with s.post(url + "/v1/chat/completions", json=BODY) as r:
                        await r.read()
                        ok = r.status == 200
                        h = r.headers.get("x-boute-overhead-ms")
                except aiohttp.ClientError:
                    ok, h = False, None
                lat.append(time.perf_counter() - t0)
                if not ok:
                    errors += 1
                if h is not None:
                    over.append(float(h))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    lat_ms = np.asarray(lat) * 1e3
    out: dict[str, Any] = {
        "requests": len(lat),
        "errors": errors,
        "req_per_s": round(len(lat) / wall, 1),
        "latency_p50_ms": round(float(np.percentile(lat_ms, 50)), 3),
        "latency_p99_ms": round(float(np.percentile(lat_ms, 99)), 3),
    }
    if over:
        out["header_overhead_p50_ms"] = round(float(np.percentile(over, 50)), 3)
        out["header_overhead_p99_ms"] = round(float(np.percentile(over, 99)), 3)
    return out


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _start_sglang_router(worker: str) -> tuple[str, subprocess.Popen[bytes]] | None:
    if shutil.which("python") is None:
        return None
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        return None
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", worker, "--port", str(port)]
    cmd += ["--policy", "round_robin", "--log-level", "error"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 60, [proc])
    return url, proc


def run(quick: bool = True) -> dict[str, Any]:
    n = 1500 if quick else 10000
    soak_s = 30.0 if quick else 600.0
    stack = Stack.start(PLAN, speedup=1000)
    sgr: tuple[str, subprocess.Popen[bytes]] | None = None
    results: dict[str, Any] = {"goals": {"overhead_p50_ms": "< 1", "overhead_p99_ms": "< 5", "rss_growth": "none"}}
    try:
        gw_url, gw_proc = stack.gateway()
        direct = stack.backend_urls[0]
        sgr = _start_sglang_router(direct)
        targets = {"direct": direct, "boute": gw_url}
        if sgr is not None:
            targets["sglang_router"] = sgr[0]
        for c in (1, 50, 200):  # 1 client: the gateway's intrinsic cost, with no queueing in a saturated loop
            asyncio.run(_closed_loop(gw_url, c, 300, None))  # warm-up (connections, caches)
            count = min(n, 500) if c == 1 else n
            row = {name: asyncio.run(_closed_loop(url, c, count, None)) for name, url in targets.items()}
            for name in ("boute", "sglang_router"):
                if name in row:
                    row[name]["e2e_overhead_p50_ms"] = round(
                        row[name]["latency_p50_ms"] - row["direct"]["latency_p50_ms"], 3
                    )
                    row[name]["e2e_overhead_p99_ms"] = round(
                        row[name]["latency_p99_ms"] - row["direct"]["latency_p99_ms"], 3
                    )
            results[f"concurrency_{c}"] = row
        results["max_req_per_s"] = {
            name: results["concurrency_200"][name]["req_per_s"] for name in targets if name != "direct"
        }
        rss0 = _rss_mb(gw_proc.pid)
        soak = asyncio.run(_closed_loop(gw_url, 50, None, soak_s))
        rss1 = _rss_mb(gw_proc.pid)
        results["soak"] = {
            "seconds": soak_s,
            "requests": soak["requests"],
            "errors": soak["errors"],
            "rss_before_mb": round(rss0, 1),
            "rss_after_mb": round(rss1, 1),
            "rss_growth_mb": round(rss1 - rss0, 1),
        }
        results["note"] = (
            f"{os.cpu_count()} CPUs shared by load generator, gateway, backend (and other work on this host); "
            "e2e overhead includes CPU contention. sglang-router run with round_robin, default settings."
        )
    finally:
        if sgr is not None:
            sgr[1].send_signal(signal.SIGINT)
            try:
                sgr[1].wait(10)
            except subprocess.TimeoutExpired:
                sgr[1].kill()
        stack.stop()
    return results


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick="--full" not in sys.argv), indent=2))
