"""An open-loop HTTP load generator: send request i at its arrival time, whatever came back before.

Why a process of its own, on aiohttp + uvloop: a Python httpx client saturates a core near 100 req/s on
this class of machine and then inflates every latency it measures; this one sends each request from a
timer, keeps one connection pool, and reports its own CPU time so a run can show the generator was not
the bottleneck. Time compression: with backends ``speedup`` times faster than modelled, arrivals are sent
``speedup`` times closer together and latencies are reported multiplied back (model seconds).

``python -m boute.serving.loadgen REQUESTS.json RESULTS.json``: the input holds ``url``, ``path``,
``send_at`` (model seconds), ``bodies`` (JSON strings), ``speedup`` and ``timeout_s``; the output holds
per request ``status`` (0: transport error or timeout), ``latency_s``, ``tier``, ``reason`` (the route's
reason, :mod:`boute.serving.reason`), ``text``, and the answer's ``prompt_tokens`` and ``cached_tokens``
(``usage.prompt_tokens_details.cached_tokens``; None where not reported) and, for a streamed answer (a body
with ``stream``: its server-sent events are read as they come), ``ttft_s``, the time to its first content;
plus ``wall_s`` and ``cpu_s`` of the generator.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from boute.serving.reason import HEADER as REASON


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def _read_whole(r: Any) -> tuple[str | None, dict[str, Any], None]:
    """A whole JSON answer: its text and usage."""
    answer = json.loads(await r.read())
    msg = answer["choices"][0]
    return (msg.get("message") or {}).get("content", msg.get("text")), answer.get("usage") or {}, None


async def _read_stream(
    r: Any, loop: asyncio.AbstractEventLoop, start: float
) -> tuple[str, dict[str, Any], float | None]:
    """A server-sent event stream of chunks: its text, the usage chunk's usage (``stream_options.include_usage``)
    and the seconds from ``start`` to the first content."""
    parts: list[str] = []
    usage: dict[str, Any] = {}
    first: float | None = None
    async for line in r.content:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") or choice.get("text")
            if piece:
                first = loop.time() - start if first is None else first
                parts.append(piece)
    return "".join(parts), usage, first


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    url = spec["url"].rstrip("/") + spec.get("path", "/v1/chat/completions")
    bodies: list[str] = spec["bodies"]
    speedup = float(spec.get("speedup", 1.0))
    send_at = [float(t) / speedup for t in spec["send_at"]]
    n = len(bodies)
    status, latency = [0] * n, [float("nan")] * n
    tier: list[str | None] = [None] * n
    reason: list[str | None] = [None] * n
    text: list[str | None] = [None] * n
    prompt_tokens: list[int | None] = [None] * n
    cached_tokens: list[int | None] = [None] * n  # usage.prompt_tokens_details.cached_tokens (None: not reported)
    ttft: list[float | None] = [None] * n  # streamed requests: time to the first content, model seconds
    timeout = aiohttp.ClientTimeout(total=float(spec.get("timeout_s", 120.0)) / speedup)
    headers = {"content-type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    loop = asyncio.get_running_loop()
    cpu0 = _cpu_s()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = loop.time() + 0.05
        t0_epoch = time.time() + (t0 - loop.time())  # wall clock of send_at 0, to line results up with logs

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, t0 + send_at[i] - loop.time()))
            start = loop.time()
            try:
                async with session.post(url, data=bodies[i], headers=headers) as r:
                    if r.status != 200:
                        await r.read()
                        status[i] = r.status
                        return
                    streamed = r.headers.get("content-type", "").startswith("text/event-stream")
                    text[i], usage, first = await (_read_stream(r, loop, start) if streamed else _read_whole(r))
                    status[i] = r.status
                    latency[i] = (loop.time() - start) * speedup
                    ttft[i] = None if first is None else first * speedup
                    tier[i] = r.headers.get("x-boute-tier")
                    reason[i] = r.headers.get(REASON)
                    prompt_tokens[i] = usage.get("prompt_tokens")
                    cached_tokens[i] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError):
                status[i] = status[i] if status[i] not in (0, 200) else 0

        await asyncio.gather(*(one(i) for i in range(n)))
        wall = loop.time() - t0
    return {
        "status": status,
        "latency_s": latency,
        "tier": tier,
        "reason": reason,
        "text": text,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "ttft_s": ttft,
        "wall_s": wall,
        "cpu_s": _cpu_s() - cpu0,
        "t0_epoch": t0_epoch,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m boute.serving.loadgen REQUESTS.json RESULTS.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    try:
        import uvloop

        result = uvloop.run(run(spec))
    except ImportError:
        result = asyncio.run(run(spec))
    tmp = Path(args[1]).with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(args[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
