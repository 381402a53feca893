"""What the gateway answers, before HTTP framing, and the wait that cancels upstream work when the client hangs
up.

Kept apart from :mod:`router.gateway` (which decides what to answer) because both HTTP paths, ASGI and the
fast protocol in :mod:`router.http.protocol`, frame these objects.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Protocol, TypeVar

from starlette.responses import Response
from starlette.types import Receive

from boute.serving.relay import RelayResponse
from router.errors import GatewayError

T = TypeVar("T")


class Body(Protocol):
    """A streamed answer's body: the chunks as they come, and a close that must run whether or not it was read
    (it releases what the request holds: the gateway's counts and the upstream connection)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T | None:
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
    (:meth:`response`), the HTTP fast path (:mod:`router.http.protocol`) writes it to the socket itself.

    ``stream``: the body as an async iterator that must be closed (``aclose``) whether or not it was read:
    closing it releases the request's holds and the upstream connection.
    """

    __slots__ = ("status", "body", "headers", "media_type", "stream")

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        media_type: str | None = "application/json",
        stream: Body | None = None,
    ) -> None:
        self.status, self.body, self.headers, self.media_type, self.stream = status, body, headers, media_type, stream

    @classmethod
    def failed(cls, exc: GatewayError) -> Reply:
        """The one answer to a :class:`router.errors.GatewayError`: its status, its OpenAI-shaped body and
        its headers (``.response()`` for the ASGI routes)."""
        return cls(exc.status, exc.body(), exc.headers)

    def response(self) -> Response:
        """As a Starlette response (the ASGI path)."""
        if self.stream is not None:
            return RelayResponse(self.stream, self.status, self.headers, self.media_type)
        if self.status == 499:
            return Response(status_code=499)
        return Response(self.body, self.status, self.headers, self.media_type)
