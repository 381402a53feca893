"""The gateway's upstream HTTP client (router/upstream/) against scripted asyncio servers.

Each case is a failure or framing mode the aiohttp client it replaced handled: keep-alive reuse, chunked and
EOF-delimited bodies, a stale pooled connection, refused connections, read timeouts, resets, cancellation.
Then issue 28: answers of MBs, whole and streamed, from fast and trickling peers, under asyncio's loop and
uvloop (the gateway's), and which upstream failures the proxy charges and retries.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from router.upstream import HIGH_WATER, ConnectError, Disconnected, Pool, UpstreamTimeout
from tests.waits import until_async

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


async def _serve(handler: Handler) -> tuple[asyncio.AbstractServer, str, list[int]]:
    """A server on a free port; the list counts accepted connections."""
    accepted: list[int] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", accepted


async def _post(pool: Pool, url: str, body: bytes = b'{"x":1}') -> tuple[int, bytes]:
    ep = pool.endpoint(url)
    conn, status = await pool.request(ep, ep.head("POST", "/v1/chat/completions"), body)
    content = await conn.body()
    pool.release(conn)
    return status, content


async def test_keep_alive_reuses_one_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            req = await _read_request(reader)
            assert req.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and req.endswith(b'{"x":1}')
            writer.write(OK)

    server, url, accepted = await _serve(handler)
    async with server:
        pool = Pool(1.0, 5.0)
        for _ in range(3):
            assert await _post(pool, url) == (200, b"{}")
        assert len(accepted) == 1
        await pool.close()


async def test_chunked_and_eof_delimited_bodies() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"2\r\nde\r\n0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    pool = Pool(1.0, 5.0)
    for handler, expected in ((chunked, b"abcde"), (until_close, b"all of it")):
        server, url, _ = await _serve(handler)
        async with server:
            assert await _post(pool, url) == (200, expected)
    await pool.close()


async def test_stream_chunks_arrive_as_they_come() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(3):
            data = b"data: %d\n\n" % i
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    server, url, _ = await _serve(handler)
    async with server:
        pool = Pool(1.0, 5.0)
        ep = pool.endpoint(url)
        conn, status = await pool.request(ep, ep.head("POST", "/x"), b"{}", stream=True)
        parts = []
        while chunk := await conn.chunk():
            parts.append(chunk)
        assert status == 200 and b"".join(parts) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n" and len(parts) >= 2
        pool.release(conn)
        assert pool.idle  # a finished stream's connection is kept
        await pool.close()


async def test_stale_pooled_connection_is_retried_on_a_new_one() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(OK)  # keep-alive promised, but the connection is closed right after (idle timeout)
        await writer.drain()

    server, url, accepted = await _serve(handler)
    async with server:
        pool = Pool(1.0, 5.0)
        assert await _post(pool, url) == (200, b"{}")
        # the close may or may not have reached the pool before the next request: either way it succeeds
        assert await _post(pool, url) == (200, b"{}")
        assert len(accepted) == 2
        await pool.close()


async def test_refused_and_read_timeout_and_reset() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pool = Pool(1.0, 0.3)
    with pytest.raises(ConnectError) as refused:
        await _post(pool, f"http://127.0.0.1:{port}")
    assert refused.value.refused

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        writer.transport.abort()

    for handler, error in ((silent, UpstreamTimeout), (reset, Disconnected)):
        server, url, _ = await _serve(handler)
        async with server:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(error):
                await _post(pool, url)
            assert loop.time() - t0 < 3
            assert not pool.busy and not any(pool.idle.values())  # the failed connection is not pooled
    await pool.close()


async def test_cancelled_request_closes_its_connection() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if await reader.read(1) == b"":  # the client side closed
            closed.set()

    server, url, _ = await _serve(handler)
    async with server:
        pool = Pool(1.0, 5.0)
        task = asyncio.ensure_future(_post(pool, url))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(closed.wait(), 2)
        assert not pool.busy
        await pool.close()


# ---- large bodies (issue 28): past HIGH_WATER and past one socket read, then the pooled connection again ----
#: bytes per answer: far above HIGH_WATER (64 KiB) and above one socket read (256 KiB), as a long reasoning
#: answer, ``n > 1`` or logprobs make them
BIG = 1_500_000
LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


def _payload(n: int = BIG) -> bytes:
    return (b"0123456789abcdef" * (n // 16 + 1))[:n]


def _big_peer(payload: bytes, *, chunked: bool, trickle: bool) -> Handler:
    """Answers every request on the connection with ``payload``: content-length or chunked framing; written
    at once, or (``trickle``) in 16 KiB pieces with a pause between them, as a slow replica does."""
    piece = 16384

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            if chunked:
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload))
            parts = [payload[i : i + piece] for i in range(0, len(payload), piece)] if trickle else [payload]
            for part in parts:
                writer.write(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
                if trickle:
                    await writer.drain()
                    await asyncio.sleep(0.001)
            if chunked:
                writer.write(b"0\r\n\r\n")
            await writer.drain()

    return handler


@LOOPS
@pytest.mark.parametrize(("chunked", "trickle"), [(False, False), (True, False), (False, True), (True, True)])
def test_large_body_then_the_pooled_connection_again(run: Callable[..., None], chunked: bool, trickle: bool) -> None:
    """A non-streamed answer of 1.5 MB arrives whole (it hung: reading paused above HIGH_WATER and only
    ``chunk()`` resumed it), and the connection serves the next request."""
    payload = _payload()

    async def main() -> None:
        server, url, accepted = await _serve(_big_peer(payload, chunked=chunked, trickle=trickle))
        async with server:
            pool = Pool(1.0, 10.0)  # a hang shows as UpstreamTimeout after 10 s without bytes
            for _ in range(3):
                status, body = await _post(pool, url)
                assert status == 200 and len(body) == len(payload) and body == payload
            assert len(accepted) == 1  # one connection, pooled after each complete answer
            await pool.close()

    run(main())


@LOOPS
def test_large_stream_keeps_backpressure_then_the_pooled_connection_again(run: Callable[..., None]) -> None:
    """A 4 MB stream read by a slow consumer: reading pauses (the gateway holds ~HIGH_WATER, not the whole
    stream), resumes as the consumer reads, and the stream arrives whole; then the connection is reused."""
    payload = _payload(4_000_000)

    async def main() -> None:
        server, url, accepted = await _serve(_big_peer(payload, chunked=True, trickle=False))
        async with server:
            pool = Pool(1.0, 10.0)
            ep = pool.endpoint(url)
            conn, status = await pool.request(ep, ep.head("POST", "/x"), b"{}", stream=True)
            parts = [await conn.chunk()]

            async def paused() -> bool:  # the consumer is away: the buffer fills up to the mark, then reading stops
                return conn.paused

            await until_async(paused, "reading paused", interval=0.01)
            assert HIGH_WATER < conn.buffered < HIGH_WATER + (1 << 20)  # one socket read past the mark at most
            while chunk := await conn.chunk():
                parts.append(chunk)
            assert status == 200 and b"".join(parts) == payload
            pool.release(conn)
            status, body = await _post(pool, url)  # the same connection answers the next request
            assert status == 200 and body == payload and len(accepted) == 1
            await pool.close()

    run(main())


@LOOPS
def test_large_error_body_of_a_stream_request_is_read_whole(run: Callable[..., None]) -> None:
    """A streamed request answered with a large non-2xx body: the proxy reads it with ``body()`` (the stream
    mode paused reading above HIGH_WATER; ``body()`` must resume it)."""
    payload = _payload()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload))
            await writer.drain()

    async def main() -> None:
        server, url, accepted = await _serve(handler)
        async with server:
            pool = Pool(1.0, 10.0)
            ep = pool.endpoint(url)
            for _ in range(2):
                conn, status = await pool.request(ep, ep.head("POST", "/x"), b"{}", stream=True)
                assert status == 400 and await conn.body() == payload
                pool.release(conn)
            assert len(accepted) == 1
            await pool.close()

    run(main())


async def test_a_read_timeout_is_neither_retried_nor_charged_a_reset_is_both() -> None:
    """Through the proxy, two replicas of a tier: one that takes the request and stays silent past the read
    timeout (a long answer) costs one replica's time and no circuit failure, and the client gets 504; one
    that resets the connection is charged and the other replica is tried (issue 28)."""
    from boute.serving import BackendSpec
    from boute.specs.plan import Plan
    from router.balancer import Balancer
    from router.config import Settings
    from router.errors import NoReplica, Unanswered
    from router.proxy import Proxy, make_client
    from tests.stack import TEST_PLAN

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await reader.read(1)  # until the gateway gives up and closes

    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.transport.abort()

    settings = Settings(upstream_timeout_s=0.3, retries=2, cb_failures=3)
    for handler, error in ((silent, Unanswered), (reset, NoReplica)):
        servers = [await _serve(handler) for _ in range(2)]
        bal = Balancer(settings)
        specs = [BackendSpec(url=u, tier="small", model="llama-3.1-8b", gpu="h100-sxm") for _, u, _ in servers]
        bal.configure(Plan.model_validate(TEST_PLAN), specs)
        proxy = Proxy(make_client(settings), bal, settings)
        with pytest.raises(error):
            await proxy.complete("small", "/v1/chat/completions", {"messages": []})
        tried = [len(accepted) for _, _, accepted in servers]
        reps = bal.pools["small"]
        if error is Unanswered:  # one replica tried, counted as failed, its circuit untouched
            assert sorted(tried) == [0, 1] and sum(r.failed for r in reps) == 1
            assert all(r.failures == 0 for r in reps)
        else:  # both tried (a stale-connection retry never applies to a fresh one), both charged
            assert tried == [1, 1] and all(r.failures == 1 for r in reps)
        await proxy.client.close()
        for server, _, _ in servers:
            server.close()
