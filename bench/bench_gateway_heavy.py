"""Heavy requests through the gateway (issue 28 items 1-2), measured with the official openai client.

The built-in plan served on emulated replicas at speedup 1000 (as ``boute serve --emulate --speedup 1000``
runs them) behind the gateway. Measured: non-streamed chat completions of 24k-60k tokens (96-240 KB of
answer; before the flow-control fix a 30k one hung past 100 s) and a 60k one streamed, each timed end to end;
``max_tokens`` 10^8 (before: no answer in 15 s, then ~20 s of 503 for the whole tier), then 20 ordinary
requests, each timed; every replica's health and failure count after it all. The same large answers straight
from one replica are the reference (the emulated engine's own CPU time per token dominates on this machine).
"""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import numpy as np

TOKEN = "bench-heavy"


def run(quick: bool = True) -> dict[str, Any]:
    import openai

    from tests.stack import Stack

    st = Stack.start(speedup=1000)
    try:
        gw, _ = st.gateway(BOUTE_ADMIN_TOKEN=TOKEN)
        client = openai.OpenAI(base_url=gw + "/v1", api_key="unused", timeout=120, max_retries=0)
        msgs = [{"role": "user", "content": "write a lot"}]
        large = []
        for tokens in (24_000, 30_000, 30_000, 45_000, 60_000) if not quick else (30_000,):
            t0 = time.perf_counter()
            out = client.chat.completions.create(model="router-small", messages=msgs, max_tokens=tokens)
            wall = time.perf_counter() - t0
            text = out.choices[0].message.content or ""
            large.append(
                {
                    "max_tokens": tokens,
                    "wall_s": round(wall, 3),
                    "answer_bytes": len(text.encode()),
                    "completion_tokens": out.usage.completion_tokens if out.usage else None,
                }  # fmt: skip
            )
        # the same answers straight from one replica (no gateway): what the gateway's figures compare with
        direct = []
        replica = openai.OpenAI(base_url=st.backend_urls[0] + "/v1", api_key="unused", timeout=120, max_retries=0)
        model = replica.models.list().data[0].id
        for tokens in (30_000,) if quick else (30_000, 60_000):
            t0 = time.perf_counter()
            replica.chat.completions.create(model=model, messages=msgs, max_tokens=tokens)
            direct.append({"max_tokens": tokens, "wall_s": round(time.perf_counter() - t0, 3)})
        t0 = time.perf_counter()
        got = 0
        for chunk in client.chat.completions.create(
            model="router-small", messages=msgs, max_tokens=60_000, stream=True
        ):
            got += sum(len((c.delta.content or "").encode()) for c in chunk.choices)
        streamed = {"max_tokens": 60_000, "wall_s": round(time.perf_counter() - t0, 3), "answer_bytes": got}
        t0 = time.perf_counter()
        try:
            client.chat.completions.create(model="router-small", messages=msgs, max_tokens=100_000_000)
            huge: dict[str, Any] = {"status": 200}
        except openai.BadRequestError as exc:
            huge = {"status": exc.status_code, "code": getattr(exc, "code", None)}
        huge["wall_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        after = []
        for _ in range(20):
            t0 = time.perf_counter()
            client.chat.completions.create(model="router-small", messages=msgs, max_tokens=64)
            after.append(time.perf_counter() - t0)
        backends = httpx.get(gw + "/admin/backends", headers={"Authorization": f"Bearer {TOKEN}"}).json()["backends"]
        return {
            "speedup": 1000,
            "load_avg": round(os.getloadavg()[0], 2),
            "large_non_streamed": large,
            "large_streamed": streamed,
            "direct_to_a_replica": direct,
            "max_tokens_1e8": huge,
            "ordinary_after": {
                "n": len(after),
                "p50_s": round(float(np.median(after)), 4),
                "max_s": round(max(after), 4),
            },
            "replicas_after": [
                {"healthy": b["healthy"], "circuit": b["circuit"], "failures": b["failures"]} for b in backends
            ],
        }
    finally:
        st.stop()
