"""The streaming response both the gateway and the emulated backends answer SSE requests with."""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class RelayResponse(StreamingResponse):
    """A streaming response that stops the upstream as soon as the client goes away.

    Starlette leaves the body iterator to the garbage collector when the client disconnects; here the
    send loop races a disconnect listener and the iterator is always closed, which closes the upstream
    connection (gateway) or cancels the generating sequence (backend).
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.ensure_future(self.stream_response(send))
        watcher = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sender, watcher):
                t.cancel()
            await asyncio.gather(sender, watcher, return_exceptions=True)
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()
