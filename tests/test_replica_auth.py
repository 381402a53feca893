"""Replicas that require a bearer token (issue 28 item 5): with BOUTE_REPLICA_TOKEN set, an emulated replica
refuses a request without it (401, as SGLang's --api-key does) while its health probe stays open, and the
gateway, holding the same token, gets through on both of its request paths, streamed and not."""

from __future__ import annotations

import httpx
import openai
import pytest

from boute.serving.auth import TOKEN_ENV, authorized, open_path, replica_token
from tests.stack import Stack

pytestmark = pytest.mark.timeout(120)  # starts processes

SECRET = "s3cret-replica-token"
BODY = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_the_rule() -> None:
    assert replica_token({TOKEN_ENV: SECRET}) == SECRET and replica_token({TOKEN_ENV: ""}) is None
    assert replica_token({}) is None
    assert authorized(f"Bearer {SECRET}", SECRET) and authorized(f"Bearer {SECRET}".encode(), SECRET)
    assert not authorized(None, SECRET) and not authorized(SECRET, SECRET) and not authorized("Bearer x", SECRET)
    assert open_path("GET", "/health") and open_path("GET", "/health_generate") and open_path("OPTIONS", "/v1/x")
    assert not open_path("POST", "/v1/chat/completions") and not open_path("GET", "/get_server_info")


@pytest.fixture(scope="module")
def stack():
    st = Stack.start(one_process=True, env={TOKEN_ENV: SECRET})
    yield st
    st.stop()


def test_a_protected_replica_refuses_a_bare_request_and_the_gateway_gets_through(stack: Stack) -> None:
    replica = stack.backend_urls[0]  # TEST_PLAN: a small-tier replica
    bare = httpx.post(replica + "/v1/chat/completions", json=BODY)
    assert bare.status_code == 401 and bare.json() == {"error": "Unauthorized"}
    wrong = httpx.post(replica + "/v1/chat/completions", json=BODY, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.get(replica + "/get_server_info").status_code == 401
    assert httpx.get(replica + "/health").status_code == 200  # probes stay open, as SGLang leaves them
    ok = httpx.post(replica + "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {SECRET}"})
    assert ok.status_code == 200

    url, _ = stack.gateway(BOUTE_REPLICA_TOKEN=SECRET)  # /ready: its health checks found every tier
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    raw = client.chat.completions.with_raw_response.create(
        model="router-large", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert raw.headers["x-boute-tier"] == "large" and raw.parse().usage.completion_tokens == 4
    chunks = client.completions.create(model="router-small", prompt="p", max_tokens=3, stream=True)
    assert sum(len(c.choices[0].text) > 0 for c in chunks if c.choices) == 3
    asgi = httpx.post(url + "/v1/chat/completions?via=asgi", json={**BODY, "model": "router-small"}, timeout=60)
    assert asgi.status_code == 200 and asgi.headers["x-boute-tier"] == "small"  # the stock ASGI path too

    # a gateway without the token: healthy replicas (probes are open), but no answer gets through
    other, _ = stack.gateway()
    refused = httpx.post(other + "/v1/chat/completions", json={**BODY, "model": "router-small"}, timeout=60)
    assert refused.status_code == 401
