"""A lean keep-alive HTTP/1.1 client for the gateway's upstream calls: asyncio protocol + httptools parser.

Why not aiohttp: profiling the gateway under wrk showed aiohttp's client machinery (request/response objects,
header multidicts, payload registry, stream readers, timer contexts) as the largest cost of the proxy itself,
well above the syscalls. A gateway needs much less: POST a body it already holds, read a status and a body
(or relay a stream), reuse the connection. Here one request is one ``transport.write`` of a pre-built header
block plus the body, the response goes through httptools' C parser with three small callbacks, and waiting
is one future per response (none when the answer is already in by the time it is awaited).

Behaviour kept from the aiohttp client it replaces (see router/proxy.py for retries):

- **errors** are :class:`UpstreamError` subclasses: a refused/failed connect (``refused`` set when the port
  actively refused), a connect or read timeout, a connection closed or reset before the response completed,
  an unparsable response. The proxy charges the replica and retries elsewhere, before any byte reaches the client.
- **a stale keep-alive connection** (closed by the replica while idle, e.g. its keep-alive timeout, before a
  byte of the response arrived) is retried once on a new connection to the same replica without charging it.
- **timeouts**: ``connect_timeout`` for a new connection; ``read_timeout`` is the longest wait for the next
  bytes of a response (aiohttp's ``sock_read``), re-armed whenever data arrives.
- **cancellation** (client disconnect, shutdown) closes the connection, so the replica sees the disconnect
  and drops the sequence; a connection is pooled again only after a complete response.
- **streams**: :meth:`Connection.chunk` yields the de-chunked body as it arrives; reading is paused when more
  than ``HIGH_WATER`` bytes wait for a slow client.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast
from urllib.parse import urlsplit

import httptools

#: unread stream bytes above which the upstream socket stops being read (a slow client)
HIGH_WATER = 1 << 16


class UpstreamError(Exception):
    """The replica failed this request (the proxy retries another one, before any byte reaches the client)."""

    refused = False


class ConnectError(UpstreamError):
    """No connection could be made (``refused``: the port actively refused it)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class UpstreamTimeout(UpstreamError):
    """Connect or read timeout."""


class Disconnected(UpstreamError):
    """The replica closed or reset the connection before the response was complete."""


class BadResponse(UpstreamError):
    """The replica's answer is not valid HTTP/1.1."""


class Endpoint:
    """A replica's address, parsed once: host, port, TLS, path prefix and the header blocks per path."""

    __slots__ = ("key", "host", "port", "ssl", "prefix", "authority", "_heads")

    def __init__(self, url: str) -> None:
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
        self._heads: dict[tuple[str, str], bytes] = {}

    def head(self, method: str, path: str) -> bytes:
        """Request line + fixed headers for ``path``, up to (excluding) the content length value."""
        k = (method, path)
        h = self._heads.get(k)
        if h is None:
            h = self._heads[k] = (
                f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self.authority}\r\n"
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
        "_waiter",
        "_last_data",
        "_timer",
        "_length_known",
    )

    def __init__(self, pool: Pool, endpoint: Endpoint) -> None:
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
    def send(self, head: bytes, body: bytes) -> None:
        """Start one request: ``head`` from :meth:`Endpoint.head`, then the body."""
        self.parser = httptools.HttpResponseParser(self)
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

    async def body(self) -> bytes:
        """Wait for the whole response; its body."""
        while not self.complete:
            await self._wait()
        chunks = self.chunks
        self.chunks = []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def chunk(self) -> bytes:
        """The next part of the body as it arrives; b"" at its end."""
        while not self.chunks:
            if self.complete:
                return b""
            await self._wait()
        chunks = self.chunks
        self.chunks, self.buffered = [], 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

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
        self._fail(UpstreamTimeout(f"no data from the replica for {self.pool.read_timeout:g}s"))

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


class Pool:
    """Idle keep-alive connections per replica address (LIFO: the warmest first, the rest expire)."""

    def __init__(self, connect_timeout: float, read_timeout: float, keepalive_s: float = 30.0) -> None:
        self.loop = asyncio.get_running_loop()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive_s = keepalive_s
        self.idle: dict[tuple[str, str, int], list[Connection]] = {}
        self.busy: set[Connection] = set()
        self._endpoints: dict[str, Endpoint] = {}

    def endpoint(self, url: str) -> Endpoint:
        ep = self._endpoints.get(url)
        if ep is None:
            ep = self._endpoints[url] = Endpoint(url)
        return ep

    async def acquire(self, ep: Endpoint) -> tuple[Connection, bool]:
        """(connection, reused?): the most recently used idle connection, else a new one."""
        idle = self.idle.get(ep.key)
        now = self.loop.time()
        while idle:
            conn = idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self.keepalive_s:
                conn.close()
                continue
            self.busy.add(conn)
            return conn, True
        conn = await self._connect(ep)
        self.busy.add(conn)
        return conn, False

    async def _connect(self, ep: Endpoint) -> Connection:
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: Connection(self, ep),
                    ep.host,
                    ep.port,
                    ssl=ep.ssl,
                    server_hostname=ep.host if ep.ssl else None,
                ),
                self.connect_timeout,
            )
        except TimeoutError:
            raise UpstreamTimeout(f"connect to {ep.authority} timed out after {self.connect_timeout:g}s") from None
        except ConnectionRefusedError:
            raise ConnectError(f"connection to {ep.authority} refused", refused=True) from None
        except OSError as exc:
            raise ConnectError(f"connect to {ep.authority} failed: {exc}") from None
        return conn

    def release(self, conn: Connection) -> None:
        """Back to the pool after a complete response, else closed."""
        self.busy.discard(conn)
        if conn.reusable():
            conn.parser = None
            conn.idle_since = self.loop.time()
            self.idle.setdefault(conn.endpoint.key, []).append(conn)
        else:
            conn.close()

    def discard(self, conn: Connection) -> None:
        self.busy.discard(conn)
        conn.close()

    def forget(self, conn: Connection) -> None:
        """A connection closed (by either side): never hand it out again."""
        self.busy.discard(conn)
        idle = self.idle.get(conn.endpoint.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def request(self, ep: Endpoint, head: bytes, body: bytes, stream: bool = False) -> tuple[Connection, int]:
        """Send one request; return its connection once the response head is in (``stream``) or the whole
        response is (else). On error or cancellation the connection is closed; otherwise the caller hands it
        back with :meth:`release` after reading the body."""
        for attempt in (0, 1):
            conn, reused = await self.acquire(ep)
            try:
                try:
                    conn.send(head, body)
                except RuntimeError as exc:  # the transport closed under us (uvloop refuses the write)
                    raise Disconnected(f"connection closed before the request was sent: {exc}") from None
                if stream:
                    status = await conn.response_head()
                else:
                    while not conn.complete:
                        await conn._wait()
                    status = conn.status
                return conn, status
            except Disconnected:
                self.discard(conn)
                if attempt == 0 and reused and not conn.got_bytes:
                    continue  # a stale keep-alive connection: once more on a new one, not the replica's fault
                raise
            except BaseException:
                self.discard(conn)
                raise
        raise AssertionError("unreachable")

    async def get_status(self, url: str, path: str, timeout: float) -> int:
        """``GET`` for health checks: the status code (the body is read and dropped)."""
        ep = self.endpoint(url)
        head = (f"GET {ep.prefix}{path} HTTP/1.1\r\nHost: {ep.authority}\r\nAccept: */*\r\nContent-Length: ").encode()
        async with asyncio.timeout(timeout):
            conn, status = await self.request(ep, head, b"")
        self.release(conn)
        return status

    async def close(self) -> None:
        for conns in list(self.idle.values()):
            for c in conns:
                c.close()
        for c in list(self.busy):
            c.close()
        self.idle.clear()
        self.busy.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks


__all__ = [
    "BadResponse",
    "ConnectError",
    "Connection",
    "Disconnected",
    "Endpoint",
    "Pool",
    "UpstreamError",
    "UpstreamTimeout",
]
