"""A streamed answer as the client's body, holding the request's in-flight counts until it is closed."""

from __future__ import annotations

import time
from typing import Protocol

from router.metrics import Metrics
from router.observe import PROMPT_USAGE, Observer
from router.proxy import Proxy, Stream


class Holder(Protocol):
    """What a held stream settles with when it ends (:class:`router.gateway.Gateway`)."""

    metrics: Metrics
    observer: Observer
    proxy: Proxy | None

    def release_stream(self, entry: str) -> None: ...


class HeldStream:
    """The relayed upstream stream as the client's body (:class:`router.http.reply.Body`). Closing it releases
    the request's holds exactly once, also when it was never read: a client gone before the first chunk must
    not leak in-flight counts or the upstream connection (an async generator that never started runs no
    ``finally`` on ``aclose``). Its end is the request's end: served (latency to the last byte) or failed."""

    __slots__ = ("gw", "upstream", "chunks", "entry", "tier", "t0", "closed")

    def __init__(self, gw: Holder, upstream: Stream, entry: str, tier: str, t0: float) -> None:
        assert gw.proxy is not None
        self.gw, self.upstream, self.entry, self.tier, self.t0 = gw, upstream, entry, tier, t0
        self.chunks = gw.proxy.relay(upstream)
        self.closed = False

    def __aiter__(self) -> HeldStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self.chunks.__anext__()
        except StopAsyncIteration:
            latency = time.perf_counter() - self.t0
            if self.upstream.failed:  # a failure mid-stream is a failed request, not a served one
                self.gw.metrics.stream_failure(self.tier)
                self.gw.observer.done(self.tier, False, 0.0, None)
            else:
                self.gw.metrics.served(self.tier, latency)
                self.gw.observer.done(self.tier, True, latency, None)
            raise
        if PROMPT_USAGE in chunk:  # the usage chunk a stream ends with when its client asked for it
            self.gw.metrics.usage(self.tier, self.upstream.replica.id, chunk)
        return chunk

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
