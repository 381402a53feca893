"""One keep-alive HTTP/1.1 connection to a replica: an asyncio protocol fed through httptools' C parser.

Split from :mod:`router.upstream.pool` (the pool and its request rule) because this is the wire: framing
(content-length, chunked, delimited by the connection's end), the read timeout, and flow control. One
request at a time; the answer is taken whole (:meth:`Connection.body`) or as it arrives (:meth:`Connection.chunk`).

Flow control: only a stream pauses reading, when more than ``HIGH_WATER`` bytes wait for a slow consumer,
and :meth:`Connection.chunk` resumes it as the consumer takes them. A whole answer is read without a stop:
nothing would come to resume it (issue 28: non-streamed answers over a few hundred KB hung until the read
timeout, were charged to the replica as failures, and the retry hung the same way).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

from boute.serving.auth import bearer
from router.errors import BadResponse, Disconnected, ReadTimeout, UpstreamError

#: unread stream bytes above which the upstream socket stops being read (a slow client)
HIGH_WATER = 1 << 16


class Owner(Protocol):
    """What a connection asks of the pool that made it (:class:`router.upstream.pool.Pool`): its loop, the
    read timeout, and to be forgotten once closed."""

    loop: asyncio.AbstractEventLoop
    read_timeout: float

    def forget(self, conn: Connection) -> None: ...


class Endpoint:
    """A replica's address, parsed once: host, port, TLS, path prefix and the header blocks per path, which
    carry the replicas' bearer token when there is one (:mod:`boute.serving.auth`)."""

    __slots__ = ("key", "host", "port", "ssl", "prefix", "authority", "auth", "_heads")

    def __init__(self, url: str, token: str | None = None) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"upstream URL must be http(s)://host[:port][/prefix], got {url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if u.scheme == "https" else None
        self.prefix = u.path.rstrip("/")
        default = (u.scheme == "https" and self.port == 443) or (u.scheme == "http" and self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = host if default else f"{host}:{self.port}"
        self.key = (u.scheme, self.host, self.port)
        self.auth = f"Authorization: {bearer(token)}\r\n" if token else ""
        self._heads: dict[tuple[str, str], bytes] = {}

    def head(self, method: str, path: str) -> bytes:
        """Request line + fixed headers for ``path``, up to (excluding) the content length value."""
        k = (method, path)
        h = self._heads.get(k)
        if h is None:
            h = self._heads[k] = (
                f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self.authority}\r\n{self.auth}"
                "Content-Type: application/json\r\nAccept: */*\r\nContent-Length: "
            ).encode("latin-1")
        return h


class Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time. Callbacks come from httptools' parser."""

    __slots__ = (
        "pool",
        "endpoint",
        "loop",
        "transport",
        "parser",
        "status",
        "chunks",
        "buffered",
        "headers_done",
        "complete",
        "keep_alive",
        "got_bytes",
        "eof_body",
        "error",
        "closed",
        "idle_since",
        "paused",
        "streaming",
        "_waiter",
        "_last_data",
        "_timer",
        "_length_known",
    )

    def __init__(self, pool: Owner, endpoint: Endpoint) -> None:
        self.pool = pool
        self.endpoint = endpoint
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.eof_body = False  # no content-length and not chunked: the body ends with the connection
        self.error: UpstreamError | None = None
        self.closed = False
        self.idle_since = 0.0
        self.paused = False
        self.streaming = False  # the body is taken chunk by chunk (reading pauses above HIGH_WATER)
        self._waiter: asyncio.Future[None] | None = None
        self._last_data = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._length_known = False

    # ---- asyncio protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio types every protocol's transport as BaseTransport; a stream connection's is a Transport
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None:  # bytes while idle: the replica is confused; never reuse this connection
            self._fail(BadResponse("unexpected bytes on an idle connection"))
            return
        self.got_bytes = True
        self._last_data = self.loop.time()
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"invalid HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.parser is not None and not self.complete:
            if self.headers_done and self.eof_body and exc is None:
                self.complete, self.keep_alive = True, False  # body delimited by the end of the connection
                self._wake()
            elif self.error is None:
                self.error = Disconnected("connection reset" if exc else "connection closed by the replica")
                self._wake()

    def eof_received(self) -> bool:
        return False  # close our side too

    def pause_writing(self) -> None:  # requests are small; nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # ---- httptools callbacks ------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.lower()
        if n == b"content-length" or (n == b"transfer-encoding" and b"chunked" in value.lower()):
            self._length_known = True

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self.headers_done = True
        self.eof_body = not self._length_known and self.status >= 200 and self.status not in (204, 304)
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.streaming:  # a whole-body read waits for on_message_complete only
            if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
                self.paused = True
                self.transport.pause_reading()
            self._wake()

    def on_message_complete(self) -> None:
        assert self.parser is not None
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # ---- request / response -------------------------------------------------------------------
    def send(self, head: bytes, body: bytes, stream: bool = False) -> None:
        """Start one request: ``head`` from :meth:`Endpoint.head`, then the body; ``stream``: its answer will
        be taken with :meth:`chunk` (reading pauses while a slow consumer lags), else with :meth:`body`."""
        self.parser = httptools.HttpResponseParser(self)
        self.streaming = stream
        self.status, self.chunks, self.buffered = 0, [], 0
        self.headers_done = self.complete = self.keep_alive = self.got_bytes = False
        self.eof_body = self._length_known = False
        self.error = None
        self._last_data = self.loop.time()
        assert self.transport is not None
        self.transport.write(b"%s%d\r\n\r\n%s" % (head, len(body), body))

    async def response_head(self) -> int:
        """Wait for the status line and headers; the status code."""
        while not self.headers_done:
            await self._wait()
        return self.status

    async def finished(self) -> None:
        """Wait for the whole response. Reading is not paused from here on: all of it is wanted, and no
        :meth:`chunk` call would come to resume it (a stream request's error answer is read this way too)."""
        if self.streaming:
            self.streaming = False
            self._resume()
        while not self.complete:
            await self._wait()

    async def body(self) -> bytes:
        """Wait for the whole response; its body."""
        await self.finished()
        chunks = self.chunks
        self.chunks, self.buffered = [], 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def chunk(self) -> bytes:
        """The next part of the body as it arrives; b"" at its end."""
        while not self.chunks:
            if self.complete:
                return b""
            await self._wait()
        chunks = self.chunks
        self.chunks, self.buffered = [], 0
        self._resume()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _resume(self) -> None:
        """Read again after a pause. The read timeout counts from here: the replica was not silent while
        we were not reading."""
        if self.paused and self.transport is not None:
            self.paused = False
            self._last_data = self.loop.time()
            self.transport.resume_reading()

    async def _wait(self) -> None:
        if self.error is not None:
            raise self.error
        fut = self._waiter = self.loop.create_future()
        timeout = self.pool.read_timeout
        self._timer = self.loop.call_at(self._last_data + timeout, self._check_timeout)
        try:
            await fut
        finally:
            self._waiter = None
            self._timer.cancel()
        if self.error is not None:
            raise self.error

    def _check_timeout(self) -> None:
        """Read timeout: no bytes for ``read_timeout`` (re-armed when data came in since it was set)."""
        due = self._last_data + self.pool.read_timeout
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._check_timeout)
            return
        self._fail(ReadTimeout(f"no data from the replica for {self.pool.read_timeout:g}s"))

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: UpstreamError) -> None:
        if self.error is None:
            self.error = exc
        self.close()
        self._wake()

    def close(self) -> None:
        """Drop the connection (the replica sees the client gone and cancels the request)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self.error is None and not self.chunks


__all__ = ["HIGH_WATER", "Connection", "Endpoint"]
