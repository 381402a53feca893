"""Upstream calls: send a request to a tier, retrying on another replica until a byte reaches the client.

Why before the first byte only: once the client has part of an answer the request is not idempotent from
its point of view. Until then a failure of the replica (refused connection, reset, connect timeout, 5xx,
empty stream) is invisible: the replica is charged a failure and the next-best replica of the same tier is
tried. A read timeout is not the replica's failure but most likely the request's own length
(:mod:`router.errors`): it is neither charged nor retried, and the client gets 504
(:class:`~router.errors.Unanswered`). Streaming responses are only handed to the client after the upstream's
first chunk has arrived.

The HTTP client is :mod:`router.upstream` (keep-alive HTTP/1.1 on asyncio protocols + httptools). It replaced
aiohttp, which had replaced httpx: on this project's bench httpx's pool managed ~85 req/s at 50 concurrent
requests where aiohttp managed ~460, and under wrk aiohttp's client machinery was then the largest cost of the
proxy itself (figures in docs/router.md).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from boute.serving.auth import replica_token
from router.balancer import BackendState, Balancer
from router.config import Settings
from router.errors import NoReplica, Unanswered, UpstreamError, retry_after
from router.upstream import Connection, Endpoint, Pool

if TYPE_CHECKING:  # boute.sim loads on the first plan, not with the gateway's imports
    from boute.sim.affinity import PromptKeys


@dataclass(slots=True)
class Result:
    status: int
    body: bytes
    replica: BackendState
    upstream_s: float


@dataclass(slots=True)
class Stream:
    """An upstream stream whose first chunk has arrived; :meth:`Proxy.relay` sends the rest and ends it."""

    conn: Connection
    first: bytes
    replica: BackendState
    upstream_s: float
    finished: bool = False
    failed: bool = False  # ended by an upstream failure mid-stream (the client got an SSE error event)


def make_client(settings: Settings) -> Pool:
    """One connection pool per gateway (call inside the running loop); it sends the replicas' bearer token
    (``BOUTE_REPLICA_TOKEN``) when the deployment set one."""
    return Pool(settings.connect_timeout_s, settings.upstream_timeout_s, token=replica_token())


def _endpoint(pool: Pool, r: BackendState) -> Endpoint:
    """The replica's parsed address, cached on the replica (parsing costs µs per request)."""
    ep = r.targets.get("")
    if ep is None:
        ep = r.targets[""] = pool.endpoint(r.url)
    return ep


class Proxy:
    def __init__(self, client: Pool, balancer: Balancer, settings: Settings) -> None:
        self.client = client
        self.balancer = balancer
        self.attempts = settings.retries + 1
        self._retry = retry_after(settings.retry_after_s)  # sent with NoReplica's 503

    @staticmethod
    def _payload(body: dict[str, Any], replica: BackendState) -> bytes:
        """The client's body with ``model`` set to the replica's model (everything else unchanged)."""
        return orjson.dumps({**body, "model": replica.spec.model})

    async def complete(self, tier: str, path: str, body: dict[str, Any], keys: PromptKeys | None = None) -> Result:
        """Non-streaming call; 4xx answers are the client's fault and passed through without retry. ``keys``:
        the prompt's prefix keys, for the replica's choice (:meth:`router.balancer.Balancer.pick`)."""
        tried: tuple[BackendState, ...] = ()
        last: str | None = None
        bal = self.balancer
        pool = self.client
        for _ in range(self.attempts):
            r = bal.pick(tier, tried, keys)
            if r is None:
                break
            tried += (r,)
            ep = _endpoint(pool, r)
            r.outstanding += 1
            t0 = time.perf_counter()
            try:
                conn, status = await pool.request(ep, ep.head("POST", path), self._payload(body, r))
                content = await conn.body()
                pool.release(conn)
            except UpstreamError as exc:
                bal.failure(r, refused=exc.refused, charge=exc.replica_fault)
                if not exc.replica_fault:
                    raise Unanswered(tier, r.id, str(exc)) from None
                last = f"{r.id}: {type(exc).__name__}"
                continue
            finally:
                r.outstanding -= 1
            if status >= 500:
                bal.failure(r)
                last = f"{r.id}: HTTP {status}"
                continue
            bal.success(r)
            return Result(status, content, r, time.perf_counter() - t0)
        raise NoReplica(tier, len(tried), last, self._retry)

    async def open_stream(
        self, tier: str, path: str, body: dict[str, Any], keys: PromptKeys | None = None
    ) -> Stream | Result:
        """Open a streaming call and read its first chunk; a 4xx comes back as a Result instead."""
        tried: tuple[BackendState, ...] = ()
        last: str | None = None
        bal = self.balancer
        pool = self.client
        for _ in range(self.attempts):
            r = bal.pick(tier, tried, keys)
            if r is None:
                break
            tried += (r,)
            ep = _endpoint(pool, r)
            r.outstanding += 1
            t0 = time.perf_counter()
            conn: Connection | None = None
            try:
                conn, status = await pool.request(ep, ep.head("POST", path), self._payload(body, r), stream=True)
                if status >= 400:
                    content = await conn.body()
                    pool.release(conn)
                    r.outstanding -= 1
                    if status >= 500:
                        bal.failure(r)
                        last = f"{r.id}: HTTP {status}"
                        continue
                    return Result(status, content, r, time.perf_counter() - t0)
                first = await conn.chunk()
                if not first:
                    raise UpstreamError("empty stream")
                return Stream(conn, first, r, time.perf_counter() - t0)
            except UpstreamError as exc:
                if conn is not None:
                    pool.discard(conn)
                r.outstanding -= 1
                bal.failure(r, refused=exc.refused, charge=exc.replica_fault)
                if not exc.replica_fault:
                    raise Unanswered(tier, r.id, str(exc)) from None
                last = f"{r.id}: {type(exc).__name__}"
            except BaseException:
                if conn is not None:
                    pool.discard(conn)
                r.outstanding -= 1
                raise
        raise NoReplica(tier, len(tried), last, self._retry)

    async def relay(self, s: Stream) -> AsyncGenerator[bytes, None]:
        """Yield the stream to the client; a mid-stream failure ends it with an SSE error event."""
        ok, done, charge = True, False, True
        conn = s.conn
        try:
            yield s.first
            while chunk := await conn.chunk():
                yield chunk
            done = True
        except UpstreamError as exc:
            ok, charge, s.failed = False, exc.replica_fault, True
            err = {"error": {"message": f"upstream failed mid-stream: {type(exc).__name__}", "type": "upstream_error"}}
            yield b"data: " + orjson.dumps(err) + b"\n\n"
        finally:
            self.finish(s, ok, done, charge)

    def finish(self, s: Stream, ok: bool, done: bool, charge: bool = True) -> None:
        """Settle a stream once: the replica's count and health (a failure counts toward its circuit only when
        ``charge``: it is the replica's), and its connection (kept for reuse only when the stream ran to its end;
        dropped otherwise, which cancels the upstream sequence)."""
        if s.finished:
            return
        s.finished = True
        s.replica.outstanding -= 1
        if ok:
            self.balancer.success(s.replica)
        else:
            self.balancer.failure(s.replica, charge=charge)
        if done:
            self.client.release(s.conn)
        else:
            self.client.discard(s.conn)
