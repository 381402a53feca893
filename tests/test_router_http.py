"""HTTP/1.1 semantics of the gateway's completion fast path (router/http/protocol.py), over raw sockets.

The fast path serves completion requests from uvicorn's parser callbacks without ASGI; these check that it
keeps what uvicorn did: pipelined requests answered in order, HTTP/1.0 and ``Connection: close``, chunked
request bodies and their size limit, ``Expect: 100-continue`` and query strings (which take the ASGI path),
and that a client leaving mid-stream frees the replica's batch slot and the gateway's in-flight count.
"""

from __future__ import annotations

import contextlib
import json
import socket

import httpx
import pytest

from tests.stack import Stack
from tests.waits import SAFETY_S, until

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)

BODY = json.dumps({"model": "router-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()


@pytest.fixture(scope="module")
def gw(stack: Stack) -> str:
    url, _ = stack.gateway(BOUTE_MAX_BODY_BYTES="5000")
    return url


def _conn(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=SAFETY_S)  # every recv waits for the gateway's answer
    return s


def _request(body: bytes = BODY, path: str = "/v1/chat/completions", extra: str = "", version: str = "1.1") -> bytes:
    head = f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
    if "transfer-encoding" not in extra.lower():
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _read_responses(s: socket.socket, n: int) -> list[tuple[int, dict[str, str], bytes]]:
    """Read ``n`` content-length framed responses."""
    buf = b""
    out = []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            data = s.recv(65536)
            if not data:
                raise ConnectionError(f"closed after {len(out)} responses")
            buf += data
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        length = int(headers["content-length"])
        while len(buf) < length:
            buf += s.recv(65536)
        out.append((status, headers, buf[:length]))
        buf = buf[length:]
    return out


def test_pipelined_requests_are_answered_in_order(gw: str) -> None:
    bodies = [
        json.dumps({"model": "router-small", "messages": [{"role": "user", "content": "a"}], "max_tokens": m}).encode()
        for m in (40, 2, 7)
    ]
    with _conn(gw) as s:
        s.sendall(b"".join(_request(b) for b in bodies) + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = _read_responses(s, 4)
    assert [g[0] for g in got] == [200, 200, 200, 200]
    lengths = [json.loads(g[2])["usage"]["completion_tokens"] for g in got[:3]]
    assert lengths == [40, 2, 7]  # in request order although the first takes longest
    assert json.loads(got[3][2]) == {"status": "ok"}


def test_http10_and_connection_close_end_the_connection(gw: str) -> None:
    for req in (_request(version="1.0"), _request(extra="Connection: close\r\n")):
        with _conn(gw) as s:
            s.sendall(req)
            ((status, headers, _),) = _read_responses(s, 1)
            assert status == 200 and headers["connection"] == "close"
            assert s.recv(1) == b""  # closed by the gateway


def test_chunked_request_body_and_its_limit(gw: str) -> None:
    def chunked(body: bytes) -> bytes:
        parts = [body[i : i + 50] for i in range(0, len(body), 50)]
        return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"

    with _conn(gw) as s:
        s.sendall(_request(chunked(BODY), extra="Transfer-Encoding: chunked\r\n"))
        ((status, headers, _),) = _read_responses(s, 1)
        assert status == 200 and headers["x-boute-tier"] == "small"
        big = json.dumps({"model": "boute", "messages": [{"role": "user", "content": "x" * 6000}]}).encode()
        s.sendall(_request(chunked(big), extra="Transfer-Encoding: chunked\r\n"))
        ((status, headers, body),) = _read_responses(s, 1)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        # answered and closed: the gateway does not go on reading (and discarding) an unbounded body
        assert headers["connection"] == "close"
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(65536) == b""


def test_expect_continue_and_query_string_take_the_asgi_path(gw: str) -> None:
    r = httpx.post(gw + "/v1/chat/completions", content=BODY, headers={"Expect": "100-continue"})
    assert r.status_code == 200 and r.headers["x-boute-tier"] == "small"
    r = httpx.post(gw + "/v1/chat/completions?trace=1", content=BODY)
    assert r.status_code == 200 and r.headers["x-boute-tier"] == "small"


def test_client_leaving_mid_stream_frees_the_slot(stack: Stack, gw: str) -> None:
    large = stack.backend_urls[2]  # TEST_PLAN: the large tier's only replica
    body = {"model": "router-large", "messages": [{"role": "user", "content": "long"}], "max_tokens": 50_000}
    with _conn(gw) as s:
        s.sendall(_request(json.dumps({**body, "stream": True}).encode()))
        first = s.recv(65536)
        assert first.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in first
        assert httpx.get(large + "/get_server_info").json()["running"] == 1
    until(lambda: httpx.get(large + "/get_server_info").json()["running"] == 0, "the replica dropped the stream")
    until(lambda: "boute_inflight 0.0" in httpx.get(gw + "/metrics").text, "the stream's in-flight hold released")


def test_streams_on_the_asgi_path_too(gw: str) -> None:
    body = {"model": "router-small", "messages": [{"role": "user", "content": "s"}], "max_tokens": 4, "stream": True}
    for url in (gw + "/v1/chat/completions", gw + "/v1/chat/completions?via=asgi"):
        with httpx.stream("POST", url, json=body) as r:
            events = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert events[-1] == "data: [DONE]" and len(events) == 4 + 3  # role, 4 pieces, finish, [DONE]
    assert "boute_inflight 0.0" in httpx.get(gw + "/metrics").text
