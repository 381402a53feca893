"""The gateway's HTTP protocol: uvicorn's httptools protocol, with the two completion endpoints served
straight from the parser callbacks, and one write per small response.

Why a fast path: under wrk, uvicorn's per-request ASGI machinery (a scope dict, a ``RequestResponseCycle``
with an ``asyncio.Event``, the ``receive``/``send`` message dicts and their header checks, a Starlette
``Response``, and a second task watching ``receive`` for a disconnect) cost about as much CPU as the proxying
itself. A ``POST /v1/chat/completions`` or ``/v1/completions`` (exact path, no ``Expect: 100-continue``) is
instead collected here and handed to :meth:`router.gateway.Gateway.serve` as bytes; its
:class:`~router.http.reply.Reply` is written with one ``transport.write`` (streams: chunked, with write flow control). A client that disconnects
cancels the request's task, which closes the upstream connection (the replica drops the sequence).
Everything else (other routes, query strings, 100-continue, upgrades) takes uvicorn's ASGI path unchanged.

HTTP/1.1 semantics kept from uvicorn: keep-alive and its idle timeout, ``Connection: close`` and HTTP/1.0,
pipelined requests answered in order (a fast request stands in as uvicorn's current ``cycle`` so later
requests queue behind it in uvicorn's own pipeline), graceful shutdown (the request tasks are in the
server's task set; ``shutdown`` ends the connection after the current response), request bodies over
``max_body_bytes`` answered 413 without being kept.

One write per response on the ASGI path too: uvicorn writes headers and body with two ``transport.write``
calls (two send syscalls, two TCP segments); :class:`CoalescingTransport` holds a header block until the
body's first chunk (at the latest until the next loop turn) and sends both with one ``writelines``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from router.config import Settings
from router.errors import InternalError
from router.http.reply import Reply
from router.http.request_body import declared_too_large
from router.openai_io import CHAT, COMPLETION

log = logging.getLogger("boute.router.http")

#: exact request targets of the fast path -> request kind
HOT = {b"/v1/chat/completions": CHAT, b"/v1/completions": COMPLETION}
#: characters never allowed in a header value (CR/LF would split the header block)
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class Completions(Protocol):
    """What the fast path asks of the gateway (:class:`router.gateway.Gateway`): its body limit, and one
    completion request served from its body (``oversize``: the body was over the limit and not kept)."""

    settings: Settings

    async def serve(self, kind: str, raw: bytes | None, *, oversize: bool = False) -> Reply: ...


class CoalescingTransport:
    """Wraps an asyncio transport; every attribute but the writes passes straight through."""

    __slots__ = ("_t", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._t = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._t.writelines((held, data))
        elif data[:5] == b"HTTP/" and data[-4:] == b"\r\n\r\n" and data[9:12] != b"100":
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._t.write(data)

    def writelines(self, chunks: Any) -> None:
        self.flush()
        self._t.writelines(chunks)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._t.is_closing():
                self._t.write(held)

    def write_eof(self) -> None:
        self.flush()
        self._t.write_eof()

    def close(self) -> None:
        self.flush()
        self._t.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)


class _NoEvent:
    """uvicorn sets its cycle's ``message_event`` on disconnect; a fast request is cancelled instead."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_EVENT = _NoEvent()


class FastRequest:
    """One completion request on the fast path. It also stands in as uvicorn's current ``cycle``, so
    uvicorn's pipelining, disconnect flag and graceful ``shutdown`` treat it as a request in progress."""

    __slots__ = (
        "kind",
        "chunks",
        "size",
        "more_body",
        "oversize",
        "keep_alive",
        "response_complete",
        "disconnected",
        "waiter",
        "task",
        "message_event",
    )

    def __init__(self, kind: str, keep_alive: bool) -> None:
        self.kind = kind
        self.chunks: list[bytes] = []
        self.size = 0
        self.more_body = True
        self.oversize = False
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.waiter: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.message_event = _NO_EVENT

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


class _DefaultHeaders:
    """uvicorn's default headers (``date``, ``server``) as bytes, re-joined when uvicorn replaces the list
    (once a second, for the date)."""

    src: list[tuple[bytes, bytes]] | None = None
    block = b""

    @classmethod
    def get(cls, headers: list[tuple[bytes, bytes]]) -> bytes:
        if headers is not cls.src:
            cls.src = headers
            cls.block = b"".join(b"%s: %s\r\n" % (n, v) for n, v in headers)
        return cls.block


class GatewayHttpProtocol(HttpToolsProtocol):
    """Pass a subclass made by :func:`gateway_protocol` as ``uvicorn.Config(http=...)``."""

    gateway: Completions | None = None  # set on the subclass by gateway_protocol()

    # The ignores below plug duck types into uvicorn's typed internals: uvicorn annotates its transport, its
    # cycle and its pipeline with the concrete classes it creates itself, but only uses the attributes
    # CoalescingTransport and FastRequest provide. connection_made's override ignore is uvicorn's own (it
    # narrows asyncio's BaseTransport to Transport, as every stream protocol does).
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.fast: FastRequest | None = None  # the fast request being answered on this connection
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]  # duck type

    def connection_lost(self, exc: Exception | None) -> None:
        fast = self.fast
        if fast is not None and not fast.response_complete:
            fast.disconnected = True
            if fast.task is not None:
                fast.task.cancel()  # closes the upstream request: the replica drops the sequence
        for cycle, _ in self.pipeline:  # queued fast requests never start
            if isinstance(cycle, FastRequest):
                cycle.disconnected = True
        super().connection_lost(exc)

    # ---- parser callbacks ---------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        kind = HOT.get(self.url)
        parser = self.parser
        if (
            kind is None
            or self.gateway is None
            or self.expect_100_continue
            or parser.get_method() != b"POST"
            or parser.should_upgrade()
        ):
            super().on_headers_complete()
            return
        req = FastRequest(kind, parser.get_http_version() != "1.0" and parser.should_keep_alive())
        if declared_too_large(self.headers, self.gateway.settings.max_body_bytes):
            req.oversize, req.keep_alive = True, False  # answer 413 and close: never read the rest
        existing = self.cycle
        self.cycle = req  # type: ignore[assignment]  # FastRequest stands in for uvicorn's cycle (class doc)
        if existing is None or existing.response_complete:
            self._start_asgi_task(req, None)
        else:  # pipelined behind a request still being answered: uvicorn starts it when that one is done
            self.flow.pause_reading()
            self.pipeline.appendleft((req, None))  # type: ignore[arg-type]  # FastRequest as a cycle, no ASGI app

    def on_body(self, body: bytes) -> None:
        req = self.cycle
        if type(req) is not FastRequest:
            super().on_body(body)
            return
        if req.response_complete or req.oversize:
            return
        req.size += len(body)
        assert self.gateway is not None
        if req.size > self.gateway.settings.max_body_bytes:  # chunked or lying: stop keeping it
            req.oversize, req.keep_alive = True, False
            req.chunks = []
            req.wake()
            return
        req.chunks.append(body)

    def on_message_complete(self) -> None:
        req = self.cycle
        if type(req) is not FastRequest:
            super().on_message_complete()
            return
        req.more_body = False
        req.wake()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if type(cycle) is not FastRequest:
            super()._start_asgi_task(cycle, app)
            return
        if cycle.disconnected:
            return
        self.fast = cycle
        task = cycle.task = self.loop.create_task(self._serve(cycle))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    # ---- the fast path ------------------------------------------------------------------------
    async def _serve(self, req: FastRequest) -> None:
        gw = self.gateway
        assert gw is not None
        reply: Reply | None = None
        try:
            while req.more_body and not req.oversize:  # the body is still arriving (usually it is all in)
                req.waiter = self.loop.create_future()
                await req.waiter
            req.waiter = None
            body = req.chunks[0] if len(req.chunks) == 1 else b"".join(req.chunks)
            req.chunks = []
            try:
                reply = await gw.serve(req.kind, body, oversize=req.oversize)
            except Exception as exc:  # never a bare 500 page: keep the OpenAI error shape
                reply = Reply.failed(InternalError(exc))
            try:
                await self._write(req, reply)
            except Exception:  # a reply that cannot be framed: drop the connection rather than hang it
                log.exception("could not write the response; closing the connection")
                self.transport.close()
        finally:
            if reply is not None and reply.stream is not None:
                await reply.stream.aclose()
            if self.fast is req:
                self.fast = None

    async def _write(self, req: FastRequest, reply: Reply) -> None:
        transport = self.transport
        if req.disconnected or transport.is_closing():
            return
        status = reply.status
        parts = [STATUS_LINE[status], _DefaultHeaders.get(self.server_state.default_headers)]
        media = reply.media_type
        if media is not None:
            if media.startswith("text/"):  # as Starlette: text types carry their charset
                media += "; charset=utf-8"
            parts.append(b"content-type: %s\r\n" % media.encode())
        if reply.headers:
            for name, value in reply.headers.items():
                # isprintable (C, ~25 instructions a character) clears almost every value before the regex
                # (~65 a character: 4,200 instructions for a 62-character reason header); both refuse the same values
                if not value.isprintable() and _BAD_VALUE.search(value):
                    raise ValueError(f"invalid value for response header {name!r}")
                parts.append(f"{name}: {value}\r\n".encode("latin-1"))
        if not req.keep_alive:
            parts.append(b"connection: close\r\n")
        stream = reply.stream
        if stream is None:
            parts.append(b"content-length: %d\r\n\r\n" % len(reply.body))
            parts.append(reply.body)
            transport.write(b"".join(parts))
        else:
            parts.append(b"transfer-encoding: chunked\r\n\r\n")
            transport.write(b"".join(parts))  # held by CoalescingTransport until the first chunk
            flow = self.flow
            async for chunk in stream:
                if chunk:
                    transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    if flow.write_paused:
                        await flow.drain()
                        if req.disconnected:
                            return
            transport.write(b"0\r\n\r\n")
        req.response_complete = True
        if not req.keep_alive:
            transport.close()
        self.on_response_complete()  # keep-alive timer, or the next pipelined request


def gateway_protocol(gateway: Completions) -> type[GatewayHttpProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, bound to ``gateway``."""
    return type("BoundGatewayHttpProtocol", (GatewayHttpProtocol,), {"gateway": gateway})
