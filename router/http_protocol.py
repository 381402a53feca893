"""uvicorn's httptools protocol with one write per small response instead of two.

Why: uvicorn writes the status line + headers on ``http.response.start`` and the body on
``http.response.body`` as two ``transport.write`` calls, i.e. two send syscalls and two TCP segments per
response. On loopback each send also runs the receiver's TCP processing, and profiling the gateway showed
the header write alone at ~15% of its CPU. Here the header block is held and sent together with the first
body chunk (one ``writelines`` -> one ``writev``). Held headers are flushed at the latest on the next
event-loop turn, and before ``close``/``write_eof``, so a response whose body is slow to come (a stream
waiting on its upstream) still sends its headers at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """Pass as ``uvicorn.Config(http=...)``; everything else is uvicorn's."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
