"""The connection pool of the gateway's upstream client: idle keep-alive connections per replica, and the
request rule (one request per connection at a time; a stale keep-alive connection retried once).

Why not aiohttp: profiling the gateway under wrk showed aiohttp's client machinery (request/response objects,
header multidicts, payload registry, stream readers, timer contexts) as the largest cost of the proxy itself,
well above the syscalls. A gateway needs much less: POST a body it already holds, read a status and a body
(or relay a stream), reuse the connection. Here one request is one ``transport.write`` of a pre-built header
block plus the body, the response goes through httptools' C parser with three small callbacks, and waiting
is one future per response (none when the answer is already in by the time it is awaited).

Behaviour kept from the aiohttp client it replaces (see router/proxy.py for retries):

- **errors** are :class:`UpstreamError` subclasses: a refused/failed connect (``refused`` set when the port
  actively refused), a connect or read timeout, a connection closed or reset before the response completed,
  an unparsable response. The proxy charges the replica and retries elsewhere, before any byte reaches the
  client, except for a read timeout (the request's, not the replica's: :mod:`router.errors`).
- **a stale keep-alive connection** (closed by the replica while idle, e.g. its keep-alive timeout, before a
  byte of the response arrived) is retried once on a new connection to the same replica without charging it.
- **timeouts**: ``connect_timeout`` for a new connection; ``read_timeout`` is the longest wait for the next
  bytes of a response (aiohttp's ``sock_read``), re-armed whenever data arrives.
- **cancellation** (client disconnect, shutdown) closes the connection, so the replica sees the disconnect
  and drops the sequence; a connection is pooled again only after a complete response.
- **streams**: :meth:`Connection.chunk` yields the de-chunked body as it arrives; reading is paused when more
  than ``HIGH_WATER`` bytes wait for a slow client, and resumed as the client takes them. A whole answer is
  read without pausing (:mod:`router.upstream.connection`, where the connection itself lives).
"""

from __future__ import annotations

import asyncio

from router.errors import ConnectError, ConnectTimeout, Disconnected
from router.upstream.connection import Connection, Endpoint


class Pool:
    """Idle keep-alive connections per replica address (LIFO: the warmest first, the rest expire)."""

    def __init__(
        self, connect_timeout: float, read_timeout: float, keepalive_s: float = 30.0, token: str | None = None
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.token = token  # the replicas' bearer token, sent on every request (boute.serving.auth)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive_s = keepalive_s
        self.idle: dict[tuple[str, str, int], list[Connection]] = {}
        self.busy: set[Connection] = set()
        self._endpoints: dict[str, Endpoint] = {}

    def endpoint(self, url: str) -> Endpoint:
        ep = self._endpoints.get(url)
        if ep is None:
            ep = self._endpoints[url] = Endpoint(url, self.token)
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
            raise ConnectTimeout(f"connect to {ep.authority} timed out after {self.connect_timeout:g}s") from None
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
                    conn.send(head, body, stream)
                except RuntimeError as exc:  # the transport closed under us (uvloop refuses the write)
                    raise Disconnected(f"connection closed before the request was sent: {exc}") from None
                if stream:
                    status = await conn.response_head()
                else:
                    await conn.finished()
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
        head = f"GET {ep.prefix}{path} HTTP/1.1\r\nHost: {ep.authority}\r\n{ep.auth}Accept: */*\r\nContent-Length: "
        async with asyncio.timeout(timeout):
            conn, status = await self.request(ep, head.encode("latin-1"), b"")
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
