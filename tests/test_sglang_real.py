"""Real SGLang 0.5.23 serving SmolLM2-135M on this CPU (``make sglang``; skips with the reason without it).

One server for the module (~1.5 min to start on 2 busy cores). It answers the requests the emulated backend is
checked with; its bodies must satisfy SGLang's own protocol models (the same judge as the contract tests) and
have the keys of the recording the emulator is compared with (``tests/sglang_recorded``), so the recording
cannot silently go stale. And it aborts a request whose client went away, as the emulator does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.emulated.launch import free_port
from backends.sglang.cpu import CpuReplica, start_cpu_replica, tree_rss_mb
from boute.errors import BouteError
from tests.test_sglang_contract import CHAT, COMPLETION, JUDGED_AS, RECORDED, _keys, _payloads, _sse, judge

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CpuReplica]:
    try:
        replica = start_cpu_replica(free_port(), tmp_path_factory.mktemp("sglang") / "server.log")
    except BouteError as exc:
        if "not built" in str(exc) or "build failed" in str(exc):
            pytest.skip(str(exc))
        raise
    try:
        print(f"\nreal sglang ready in {replica.ready_s:.1f} s, RSS {tree_rss_mb(replica.proc.pid):.0f} MB")
        yield replica
    finally:
        replica.stop()


@pytest.fixture(scope="module")
def real_bodies(real: CpuReplica) -> dict[str, Any]:
    chat, compl = real.url + "/v1/chat/completions", real.url + "/v1/completions"
    return {
        "chat": httpx.post(chat, json=CHAT, timeout=120).json(),
        "completion": httpx.post(compl, json=COMPLETION, timeout=120).json(),
        "chat_stream": _sse(chat, {**CHAT, "stream": True}),
        "chat_stream_usage": _sse(chat, {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
        "completion_stream": _sse(compl, {**COMPLETION, "stream": True}),
        "error_context": httpx.post(chat, json={**CHAT, "max_tokens": 10**6}, timeout=60).json(),
        "error_validation": httpx.post(compl, json={**COMPLETION, "max_tokens": -1}, timeout=60).json(),
        "models": httpx.get(real.url + "/v1/models").json(),
    }


def test_sglang_real_server_bodies_satisfy_its_own_protocol(real_bodies: dict[str, Any]) -> None:
    payloads = _payloads(real_bodies)
    for (where, _), v in zip(payloads, judge(payloads=[p for _, p in payloads])["payloads"], strict=True):
        assert v == {"errors": [], "unknown": []}, (where, JUDGED_AS[where.split("[")[0]], v)


@pytest.mark.parametrize("name", ["chat", "completion", "error_context", "error_validation", "models"])
def test_sglang_real_server_has_the_recorded_keys(real_bodies: dict[str, Any], name: str) -> None:
    assert _keys(real_bodies[name]) == _keys(RECORDED[name])


def test_sglang_real_server_usage_and_finish_reasons(real: CpuReplica, real_bodies: dict[str, Any]) -> None:
    chat = real_bodies["chat"]
    assert chat["model"] == CHAT["model"]  # the request's name is echoed (the emulator does the same)
    # a real model may end its answer (EOS) before max_tokens: 'stop' below it, 'length' exactly at it
    fin, used = chat["choices"][0]["finish_reason"], chat["usage"]["completion_tokens"]
    assert (fin == "length" and used == 8) or (fin == "stop" and 0 < used <= 8), (fin, used)
    u = chat["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert real_bodies["chat_stream_usage"][-1]["usage"]["completion_tokens"] == 8
    card = real_bodies["models"]["data"][0]
    assert card["max_model_len"] == 8192 and card["id"] == "smollm2-135m"
    ctx = real_bodies["error_context"]
    assert (ctx["type"], ctx["code"]) == ("BadRequestError", 400) and "context length of 8192" in ctx["message"]
    assert httpx.get(real.url + "/metrics").status_code == 404  # not enabled by the launcher
    assert httpx.get(real.url + "/health_generate", timeout=120).status_code == 200


def test_sglang_real_server_aborts_when_the_client_leaves(real: CpuReplica) -> None:
    """A 3,000-token stream (hours... minutes on this CPU) is left after its first chunk; a later request's
    prefill must find no request running, within a minute (the scheduler's own log line says so)."""
    long = {"model": "m", "prompt": "Count:", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", real.url + "/v1/completions", json=long, timeout=120) as s:
        assert next(s.iter_lines()).startswith("data: {")
    deadline = time.monotonic() + 60
    running: list[int] = []
    while time.monotonic() < deadline:
        mark = len(real.log_text())
        r = httpx.post(real.url + "/v1/completions", json={**COMPLETION, "max_tokens": 1}, timeout=120)
        assert r.status_code == 200
        running = [int(n) for n in re.findall(r"Prefill batch.*?#running-req: (\d+)", real.log_text()[mark:])]
        if running and running[-1] == 0:
            break
    assert running and running[-1] == 0, f"the abandoned request still runs: {running}"
