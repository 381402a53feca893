"""The gateway's access log: one line per completion request it answers or refuses, on the
``boute.router.access`` logger, when ``BOUTE_ACCESS_LOG`` is set (off by default).

logfmt, so a log shipper reads it without a pattern; ``reason`` is the route's reason, the ``x-boute-reason``
header (:mod:`boute.serving.reason`)::

    kind=chat status=200 tier=large replica=large-h100-sxm-0 ms=12.345 reason="preroute; tier=large; by=threshold; score=0.6132; above=0.4821"
    status=429 error=rate_limit_exceeded tier=-

``ms``: the request's time in the gateway until its answer was ready (a streamed answer: its first token).
Formatted lazily: the arguments go to :mod:`logging`, which formats only a record that a handler will emit.
An emitted line costs the event loop ~10 µs of CPU (``timeit`` of :func:`answered` into a file handler with
``python -m router``'s format, min of 5, on the shared 2-core host), which is why the log is off unless asked for.
"""

from __future__ import annotations

import logging

from boute.serving.reason import HEADER
from router.errors import GatewayError, UpstreamFailure
from router.http.reply import Reply

log = logging.getLogger("boute.router.access")


def enable() -> None:
    """Emit the access lines whatever the root logger's level (``python -m router`` logs warnings only)."""
    log.setLevel(logging.INFO)


def answered(kind: str, reply: Reply, seconds: float) -> None:
    """A request the gateway routed (``reply``: whatever the tier answered, errors passed on included)."""
    h = reply.headers or {}
    log.info(
        'kind=%s status=%d tier=%s replica=%s ms=%.3f reason="%s"',
        kind,
        reply.status,
        h.get("x-boute-tier", "-"),
        h.get("x-boute-replica", "-"),
        seconds * 1e3,
        h.get(HEADER, "-"),
    )


def refused(exc: GatewayError) -> None:
    """A request the gateway answered with an error of its own (shed, malformed, no replica left, ...)."""
    tier = exc.tier if isinstance(exc, UpstreamFailure) else "-"
    log.info("status=%d error=%s tier=%s", exc.status, exc.code or exc.kind, tier)
