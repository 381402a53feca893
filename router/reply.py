"""What the gateway answers, before HTTP framing, and the request's life around it: the reply (a body or a
relayed stream), the stream wrapper that releases a request's holds exactly once, and the wait that
cancels upstream work when the client hangs up.

Kept apart from :mod:`router.gateway` (which decides what to answer) because both HTTP paths, ASGI and
the fast protocol in router/http_protocol.py, frame these objects.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from boute.serving.relay import RelayResponse
from router.openai_io import error_body, error_type

if TYPE_CHECKING:
    from router.gateway import Gateway
    from router.proxy import Stream


class ClientGone(Exception):
    """The client disconnected while its request body was still arriving."""


async def _wait_disconnect(receive: Any) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def unless_disconnected(receive: Any, work: Any) -> Any:
    """Await ``work`` in this task; if the client hangs up first, cancel it (closing the upstream request).

    Why not ``asyncio.wait`` on two tasks: that costs a second task plus a waiter future per request.
    Here only the disconnect watcher is a task; when it fires it cancels this task, and the cancellation is
    turned into ``None`` (answered 499) and un-counted so the caller's task is left clean.
    """
    task = asyncio.current_task()
    assert task is not None
    watcher = asyncio.get_running_loop().create_task(_wait_disconnect(receive))
    live = [True]

    def gone(w: asyncio.Task[None]) -> None:
        if live[0] and not w.cancelled():
            live[0] = False
            task.cancel()

    watcher.add_done_callback(gone)
    try:
        return await work
    except asyncio.CancelledError:
        if live[0]:  # cancelled from outside (shutdown): not ours to swallow
            raise
        task.uncancel()
        return None
    finally:
        live[0] = False
        watcher.cancel()


class Reply:
    """What the gateway answers, before HTTP framing: the ASGI path turns it into a Starlette response
    (:meth:`response`), the HTTP fast path (router/http_protocol.py) writes it to the socket itself.

    ``stream``: the body as an async iterator that must be closed (``aclose``) whether or not it was read:
    closing it releases the request's holds and the upstream connection.
    """

    __slots__ = ("status", "body", "headers", "media_type", "stream")

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        media_type: str | None = "application/json",
        stream: HeldStream | None = None,
    ) -> None:
        self.status, self.body, self.headers, self.media_type, self.stream = status, body, headers, media_type, stream

    @classmethod
    def error(
        cls,
        status: int,
        message: str,
        kind: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """OpenAI's error shape (:func:`router.openai_io.error_body`); ``.response()`` for the ASGI routes."""
        return cls(status, error_body(message, error_type(status, kind), param, code), headers)

    def response(self) -> Response:
        """As a Starlette response (the ASGI path)."""
        if self.stream is not None:
            return RelayResponse(self.stream, self.status, self.headers, self.media_type)
        if self.status == 499:
            return Response(status_code=499)
        return Response(self.body, self.status, self.headers, self.media_type)


class HeldStream:
    """The relayed upstream stream as the client's body. Closing it releases the request's holds exactly once,
    also when it was never read: a client gone before the first chunk must not leak in-flight counts or the
    upstream connection (an async generator that never started runs no ``finally`` on ``aclose``)."""

    __slots__ = ("gw", "upstream", "chunks", "entry", "tier", "t0", "closed")

    def __init__(self, gw: Gateway, upstream: Stream, entry: str, tier: str, t0: float) -> None:
        assert gw.proxy is not None
        self.gw, self.upstream, self.entry, self.tier, self.t0 = gw, upstream, entry, tier, t0
        self.chunks = gw.proxy.relay(upstream)
        self.closed = False

    def __aiter__(self) -> HeldStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.chunks.__anext__()
        except StopAsyncIteration:
            latency = time.perf_counter() - self.t0
            if self.upstream.failed:  # a failure mid-stream is a failed request, not a served one
                self.gw.metrics.stream_failure(self.tier)
                self.gw.observer.done(self.tier, False, 0.0, None)
            else:
                self.gw.metrics.served(self.tier, latency)
                self.gw.observer.done(self.tier, True, latency, None)
            raise

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self.chunks.aclose()
        finally:
            assert self.gw.proxy is not None
            self.gw.proxy.finish(self.upstream, ok=True, done=False)  # no-op once the relay has finished it
            self.gw.release_stream(self.entry)
