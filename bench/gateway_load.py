"""Closed-loop HTTP load generator for the gateway bench, run as its own process(es).

Why a separate process: in one process with the gateway (or the bench driver) the load generator's own
CPU would be charged to, and would queue behind, the thing being measured. Each process runs ``clients``
closed-loop aiohttp clients on uvloop and reports latencies, ``x-boute-overhead-ms`` values,
errors, wall time and the process's own CPU seconds, written as JSON to ``--out`` (so the bench can show the client is not the bottleneck).

``python -m bench.gateway_load --url URL --clients C --out FILE (--requests N | --seconds S) [--max-tokens T [--max-tokens-hi H]]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from typing import Any


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def closed_loop(
    url: str, clients: int, requests: int | None, seconds: float | None, max_tokens: int, max_tokens_hi: int
) -> dict[str, Any]:
    import aiohttp
    import orjson

    # answer lengths spread over [max_tokens, max_tokens_hi]: equal lengths would keep closed-loop clients in
    # lock-step cohorts that a batching backend finishes in the same iteration (bursts no real traffic has)
    rng = random.Random(os.getpid())
    hi = max(max_tokens, max_tokens_hi)
    bodies = [
        orjson.dumps({"model": "boute", "messages": [{"role": "user", "content": "bench"}], "max_tokens": m})
        for m in range(max_tokens, hi + 1, max(1, (hi - max_tokens) // 64))
    ]
    headers = {"content-type": "application/json"}
    lat: list[float] = []
    over: list[float] = []
    net: list[float] = []  # client latency minus the backend's reported service time (ms)
    errors = 0
    remaining = [requests or 0]
    conn = aiohttp.TCPConnector(limit=clients + 8)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, skip_auto_headers=("User-Agent",)) as s:
        target = url + "/v1/chat/completions"

        async def one() -> tuple[bool, float, str | None]:
            t0 = time.perf_counter()
            try:
                async with s.post(target, data=rng.choice(bodies), headers=headers) as r:
                    raw = await r.read()
                    dt = time.perf_counter() - t0
                    ok = r.status == 200
                    if ok and b'"service_ms"' in raw:  # emulated backend: its own time, to subtract
                        net.append(dt * 1e3 - orjson.loads(raw)["service_ms"])
                    return ok, dt, r.headers.get("x-boute-overhead-ms")
            except (TimeoutError, aiohttp.ClientError):
                return False, time.perf_counter() - t0, None

        # warm-up: open every connection once so connection set-up is not in the figures
        await asyncio.gather(*(one() for _ in range(clients)))
        deadline = time.perf_counter() + seconds if seconds else None

        async def worker() -> None:
            nonlocal errors
            while (deadline is not None and time.perf_counter() < deadline) or (deadline is None and remaining[0] > 0):
                remaining[0] -= 1
                ok, dt, h = await one()
                lat.append(dt)
                if not ok:
                    errors += 1
                elif h is not None:
                    over.append(float(h))

        net.clear()
        cpu0, t0 = _cpu_s(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    return {"lat_s": lat, "overhead_ms": over, "net_ms": net, "errors": errors, "wall_s": wall, "cpu_s": cpu}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gateway_load")
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--requests", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--out", required=True, help="JSON result file")
    ap.add_argument("--max-tokens-hi", type=int, default=0, help="answer lengths spread up to this")
    a = ap.parse_args(argv)
    import gc

    import uvloop

    gc.freeze()

    out = uvloop.run(closed_loop(a.url, a.clients, a.requests, a.seconds, a.max_tokens, a.max_tokens_hi))
    with open(a.out, "w") as fh:  # a file, not stdout: nothing else can interleave with the result
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
