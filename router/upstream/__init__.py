"""The gateway's HTTP client to its replicas: keep-alive HTTP/1.1 on asyncio protocols + httptools' parser.

- :mod:`router.upstream.pool`: idle connections per replica, and the request rule (stale keep-alive
  connections retried once, errors as :class:`router.errors.UpstreamError`);
- :mod:`router.upstream.connection`: one connection: framing, the read timeout, flow control.

Retries across replicas are :mod:`router.proxy`'s; the server side of HTTP is :mod:`router.http`.
"""

from router.errors import (
    BadResponse,
    ConnectError,
    ConnectTimeout,
    Disconnected,
    ReadTimeout,
    UpstreamError,
    UpstreamTimeout,
)
from router.upstream.connection import HIGH_WATER, Connection, Endpoint
from router.upstream.pool import Pool

__all__ = [
    "HIGH_WATER",
    "BadResponse",
    "ConnectError",
    "ConnectTimeout",
    "Connection",
    "Disconnected",
    "Endpoint",
    "Pool",
    "ReadTimeout",
    "UpstreamError",
    "UpstreamTimeout",
]
