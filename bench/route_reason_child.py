"""One gateway, in this process, serving completion requests from bytes: CPU seconds per request, measured.

Run by ``bench/bench_route_reason.py`` as ``python bench/route_reason_child.py SPEC.json`` with ``PYTHONPATH``
naming the tree whose ``router/`` and ``boute/`` are measured (the current one, or the commit before the route
reason). No HTTP client and no server: each request is :meth:`router.gateway.Gateway.serve` on a body already in
bytes, then framed by the fast path's own ``GatewayHttpProtocol._write`` into a transport that drops the bytes.
Only the replicas are elsewhere (their own process, over real HTTP). ``time.process_time`` of this process over
a batch, divided by its requests, is the gateway's CPU per request (its upstream client included); batches
are repeated and each is reported, so the caller can take the minimum (the run least disturbed by other
tenants of the host).

Under callgrind (``valgrind --tool=callgrind --instr-atstart=no``), ``BOUTE_BENCH_CALLGRIND_LIB`` names a tiny
shared library whose ``cg_start``/``cg_stop`` issue callgrind's client requests: instructions are counted
during the measured batches only (start-up and warm-up excluded), the count the caller divides by requests.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any


class _Sink:
    """A transport that takes every byte and sends none."""

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


async def _main(spec: dict[str, Any]) -> dict[str, Any]:
    from boute.serving import BACKENDS
    from boute.specs.plan import Plan
    from router.config import Settings
    from router.gateway import Gateway
    from router.http.protocol import FastRequest, GatewayHttpProtocol
    from router.openai_io import CHAT

    plan = Plan.model_validate(spec["plan"])
    backends = BACKENDS.validate_python(spec["backends"])
    gw = Gateway(Settings(health_interval_s=60.0, observe_interval_s=60.0), plan, backends)
    await gw.start()
    bodies = [b.encode() for b in spec["bodies"]]
    frame = SimpleNamespace(
        transport=_Sink(), server_state=SimpleNamespace(default_headers=[]), on_response_complete=lambda: None
    )
    write = GatewayHttpProtocol._write
    headers_seen: dict[str, str] = {}

    async def one(body: bytes) -> None:
        reply = await gw.serve(CHAT, body)
        if reply.status != 200:
            raise RuntimeError(f"status {reply.status}: {reply.body[:200]!r}")
        await write(frame, FastRequest(CHAT, True), reply)  # type: ignore[arg-type]  # duck-typed protocol
        if not headers_seen and reply.headers:
            headers_seen.update(reply.headers)

    async def batch(n: int, concurrency: int) -> None:
        it = iter(range(n))

        async def worker() -> None:
            for i in it:
                await one(bodies[i % len(bodies)])

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    await batch(spec["warmup"], spec["concurrency"])
    gc.collect()
    gc.freeze()
    lib = os.environ.get("BOUTE_BENCH_CALLGRIND_LIB")
    cg = ctypes.CDLL(lib) if lib else None
    per_request_us = []
    if cg is not None:
        cg.cg_start()
    for _ in range(spec["batches"]):
        t0 = time.process_time()
        await batch(spec["requests"], spec["concurrency"])
        per_request_us.append((time.process_time() - t0) / spec["requests"] * 1e6)
    if cg is not None:
        cg.cg_stop()
    await gw.stop()
    return {"cpu_us_per_request": per_request_us, "headers": headers_seen}


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import uvloop

    out = uvloop.run(_main(spec))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
