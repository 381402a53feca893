"""Real SGLang 0.5.23 on this CPU (``make sglang``): start-up time, memory, and what one replica serves.

Figures the issue asks for (issue 30): the time from ``launch_server`` to ``/health`` 200, the resident memory
of the server's process tree (HTTP server + scheduler + detokenizer) once ready and after the requests, and
per streamed request its time to first token and decode rate (SmolLM2-135M bf16, torch_native attention,
``--max-total-tokens 16384``: see backends/sglang/cpu.py for why).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

PROMPTS = ("What is 2+2?", "Name three colours.", "Write one sentence about the sea.", "Say hello.", "Count to five.")


def _stream(url: str, prompt: str, max_tokens: int) -> dict[str, float]:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    t0 = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line and first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return {"ttft_ms": (first - t0) * 1e3, "decode_tok_s": (max_tokens - 1) / max(end - first, 1e-9)}


def run(quick: bool = False) -> dict[str, Any]:
    from backends.sglang.cpu import start_cpu_replica, tree_rss_mb
    from tests.services import free_port

    n_tokens = 16 if quick else 32
    with tempfile.TemporaryDirectory() as tmp:
        replica = start_cpu_replica(free_port(), Path(tmp) / "server.log")
        try:
            rss_ready = tree_rss_mb(replica.proc.pid)
            rows = [_stream(replica.url, p, n_tokens) for p in PROMPTS]
            rss_after = tree_rss_mb(replica.proc.pid)
        finally:
            replica.stop()
    return {
        "startup_to_health_s": round(replica.ready_s, 1),
        "rss_mb_ready": round(rss_ready),
        "rss_mb_after_requests": round(rss_after),
        "requests": len(rows),
        "output_tokens_each": n_tokens,
        "ttft_ms_median": round(statistics.median(r["ttft_ms"] for r in rows), 1),
        "decode_tok_s_median": round(statistics.median(r["decode_tok_s"] for r in rows), 1),
    }
