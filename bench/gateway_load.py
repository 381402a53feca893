"""Closed-loop HTTP load generator for the gateway bench, run as its own process(es).

Why a separate process: in one process with the gateway (or the bench driver) the load generator's own
CPU would be charged to, and would queue behind, the thing being measured. Each process runs ``clients``
closed-loop aiohttp clients on uvloop and reports latencies, ``x-boute-overhead-ms`` values,
errors, wall time and the process's own CPU seconds, written as JSON to ``--out`` (so the bench can show the client is not the bottleneck).

``python -m bench.gateway_load --url URL --clients C --out FILE (--requests N | --seconds S) [--max-tokens T [--max-tokens-hi H]]``

Open loop (overload measurement): ``--rate R --seconds S [--timeout T] [--bodies FILE]`` sends R requests/s on a
fixed schedule whatever the answers, each with a client timeout of T seconds, and records every request's status
and latency, so the share and the latency of 429 answers can be read off. ``--bodies`` is a file of request bodies
(one JSON object per line, e.g. GSM8K prompts), drawn at random per request.
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


async def open_loop(url: str, rate: float, seconds: float, timeout: float, bodies: list[bytes]) -> dict[str, Any]:
    """``rate`` requests/s for ``seconds`` on a fixed schedule (open loop: a slow answer does not slow the
    offered load, as with many independent users), each request bounded by a client ``timeout``.

    Returns per-request status (0 = client timeout or connection error) and latency, BOute's
    ``x-boute-overhead-ms`` of its successful answers, the achieved send rate, and this process's CPU (so a lagging generator is visible: ``send_lag_p99_ms``).
    """
    import aiohttp

    rng = random.Random(os.getpid())
    headers = {"content-type": "application/json"}
    status: list[int] = []
    lat: list[float] = []
    lag: list[float] = []
    over: list[float] = []  # x-boute-overhead-ms of the answers that carry it (BOute's gateway)
    conn = aiohttp.TCPConnector(limit=0)
    tmo = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(connector=conn, timeout=tmo, skip_auto_headers=("User-Agent",)) as s:
        target = url + "/v1/chat/completions"

        async def one(body: bytes) -> None:
            t0 = time.perf_counter()
            try:
                async with s.post(target, data=body, headers=headers) as r:
                    await r.read()
                    code = r.status
                    h = r.headers.get("x-boute-overhead-ms")
                    if h is not None and code == 200:
                        over.append(float(h))
            except (TimeoutError, aiohttp.ClientError):
                code = 0
            status.append(code)
            lat.append(time.perf_counter() - t0)

        # warm-up: a few connections opened before the clock starts
        await asyncio.gather(*(one(bodies[0]) for _ in range(4)))
        status.clear()
        lat.clear()
        over.clear()
        tasks = []
        cpu0, start = _cpu_s(), time.perf_counter()
        n = int(rate * seconds)
        for i in range(n):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lag.append(max(0.0, time.perf_counter() - due))
            tasks.append(asyncio.ensure_future(one(rng.choice(bodies))))
        sent_wall = time.perf_counter() - start
        await asyncio.gather(*tasks)
        wall, cpu = time.perf_counter() - start, _cpu_s() - cpu0
    lag.sort()
    return {
        "status": status,
        "lat_s": lat,
        "overhead_ms": over,
        "sent": n,
        "send_wall_s": sent_wall,
        "send_lag_p99_ms": lag[int(0.99 * (len(lag) - 1))] * 1e3 if lag else 0.0,
        "wall_s": wall,
        "cpu_s": cpu,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gateway_load")
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--out", required=True, help="JSON result file")
    ap.add_argument("--max-tokens-hi", type=int, default=0, help="answer lengths spread up to this")
    ap.add_argument("--rate", type=float, help="open loop: requests per second (with --seconds)")
    ap.add_argument("--timeout", type=float, default=10.0, help="open loop: client timeout per request (s)")
    ap.add_argument("--bodies", help="open loop: file of JSON request bodies, one per line")
    a = ap.parse_args(argv)
    import gc

    import uvloop

    gc.freeze()

    if a.rate:
        if a.bodies:
            with open(a.bodies, "rb") as fh:
                bodies = [line.rstrip(b"\n") for line in fh if line.strip()]
        else:
            bodies = [
                b'{"model":"boute","messages":[{"role":"user","content":"bench"}],"max_tokens":%d}' % a.max_tokens
            ]
        out = uvloop.run(open_loop(a.url, a.rate, a.seconds or 10.0, a.timeout, bodies))
    else:
        out = uvloop.run(closed_loop(a.url, a.clients, a.requests, a.seconds, a.max_tokens, a.max_tokens_hi))
    with open(a.out, "w") as fh:  # a file, not stdout: nothing else can interleave with the result
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
