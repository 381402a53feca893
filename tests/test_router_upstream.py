"""The gateway's upstream HTTP client (router/upstream.py) against scripted asyncio servers.

Each case is a failure or framing mode the aiohttp client it replaced handled: keep-alive reuse, chunked and
EOF-delimited bodies, a stale pooled connection, refused connections, read timeouts, resets, cancellation.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from router.upstream import ConnectError, Disconnected, Pool, UpstreamTimeout

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
