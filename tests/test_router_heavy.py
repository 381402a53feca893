"""Heavy requests through the gateway, with the official openai client (issue 28): answers of hundreds of KB
to MBs, streamed and not, and a request that can never fit the model's context.

The replicas run at speedup 2000 (their own module stack) so that a 120,000-token answer is made in seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.stack import Stack

pytestmark = pytest.mark.timeout(600)  # every test here starts processes (a hang fails in 10 min, not 15)

TOKEN = "heavy-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: tokens of a long answer: 480 KB of text, more than one socket read (256 KiB), within llama-3.1's context
LONG = 120_000


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    st = Stack.start(speedup=2000)
    try:
        yield st
    finally:
        st.stop()


@pytest.fixture(scope="module")
def gw(stack: Stack) -> str:
    url, _ = stack.gateway(BOUTE_ADMIN_TOKEN=TOKEN)
    return url


def _client(gw: str) -> openai.OpenAI:
    # a hang fails in 240 s (a 120k-token answer takes ~15 s of emulated-engine CPU, several times that on a
    # busy machine) instead of waiting out the gateway's 300 s read timeout; no retries hide one
    return openai.OpenAI(base_url=gw + "/v1", api_key="unused", timeout=240, max_retries=0)


def _tier_untouched(gw: str) -> None:
    """Every replica healthy, its circuit closed, no failure charged."""
    for b in httpx.get(gw + "/admin/backends", headers=AUTH).json()["backends"]:
        assert b["healthy"] and b["circuit"] == "closed" and b["failures"] == 0, b


@pytest.mark.slow  # the emulated engine spends ~0.1 ms of CPU per token: a 120,000-token answer is ~15 s here
def test_long_answers_streamed_and_not_then_ordinary_requests(gw: str) -> None:
    """A 480 KB answer hung in the gateway (its socket paused above 64 KiB and nothing resumed it); now it
    comes back whole, then a 120 KB one (the size the issue saw hang) over the pooled connections, a 2.6 MB
    stream too, and the tier stays healthy."""
    client = _client(gw)
    for tokens in (LONG, 30_000):
        out = client.chat.completions.create(
            model="router-small", messages=[{"role": "user", "content": "write a lot"}], max_tokens=tokens
        )
        assert out.usage is not None and out.usage.completion_tokens == tokens
        assert len(out.choices[0].message.content or "") == 4 * tokens
    stream = client.chat.completions.create(
        model="router-small", messages=[{"role": "user", "content": "stream a lot"}], max_tokens=20_000, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert len(text) == 4 * 20_000
    ok = client.chat.completions.create(model="boute", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert ok.choices[0].finish_reason == "length"
    _tier_untouched(gw)


async def test_a_request_beyond_the_context_is_refused_and_harms_nothing(stack: Stack, gw: str) -> None:
    """``max_tokens: 10**8`` gets OpenAI's 400 from the gateway itself, at once, without reaching a replica;
    the 20 ordinary requests after it are all answered and no replica is charged or kept busy."""
    client = openai.AsyncOpenAI(base_url=gw + "/v1", api_key="unused", timeout=240, max_retries=0)
    for field in ("max_tokens", "max_completion_tokens"):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="boute", messages=[{"role": "user", "content": "everything"}], **{field: 100_000_000}
            )
        err = refused.value
        assert err.status_code == 400 and err.code == "context_length_exceeded" and err.param == field
        assert err.type == "invalid_request_error" and "maximum context length of 131072 tokens" in err.message
        assert "x-boute-replica" not in err.response.headers  # answered by the gateway, no replica involved
    outs = await asyncio.gather(
        *(
            client.chat.completions.create(
                model="boute", messages=[{"role": "user", "content": f"ordinary {i}"}], max_tokens=8
            )
            for i in range(20)
        )
    )
    assert all(o.usage is not None and o.usage.completion_tokens == 8 for o in outs)
    # the gateway's estimate is a lower bound: what it passes, the replica counts exactly and may refuse itself
    with pytest.raises(openai.BadRequestError) as by_replica:
        await client.completions.create(model="router-small", prompt="abcd" * 50_000, max_tokens=100_000)
    assert "150000 tokens" in by_replica.value.message and "x-boute-replica" in by_replica.value.response.headers
    await client.close()
    _tier_untouched(gw)
    async with httpx.AsyncClient() as c:
        for u in stack.backend_urls:
            info = (await c.get(u + "/get_server_info")).json()
            assert info["running"] == 0 and info["waiting"] == 0
