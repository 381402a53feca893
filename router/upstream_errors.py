"""What can go wrong on an upstream call, and which failures say the replica is unwell.

Why the distinction: the gateway charges a replica's circuit breaker for a failure and retries the request
on another replica of the tier. That is right when the failure is the replica's: it refused or dropped the
connection, sent garbage, could not be reached in time. It is wrong when the request itself is what takes
long: a read timeout (no byte for ``read_timeout`` seconds) on a non-streamed request is most often a long
answer being generated. Charging it, one heavy request charges every replica it is retried on, a few of
them trip the whole tier, and each retry repeats the heavy work elsewhere (issue 28). So such a failure is
the request's (``replica_fault`` False): not charged, not retried; the client gets a 504. A replica that is
really hung is still found by the active health checks and by the connection-level failures of other
requests.
"""

from __future__ import annotations


class UpstreamError(Exception):
    """An upstream call failed (the proxy retries another replica, before any byte reaches the client,
    when ``replica_fault``)."""

    #: the port actively refused the connection (the replica is gone: trip it at once)
    refused = False
    #: the failure says the replica is unwell (counts toward its circuit, retried elsewhere); False when the
    #: request itself may be the cause (a read timeout)
    replica_fault = True


class ConnectError(UpstreamError):
    """No connection could be made (``refused``: the port actively refused it)."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class UpstreamTimeout(UpstreamError):
    """Connect or read timeout."""


class ConnectTimeout(UpstreamTimeout):
    """No connection within ``connect_timeout``: the replica (or its host) does not answer."""


class ReadTimeout(UpstreamTimeout):
    """Connected and sent, then no byte for ``read_timeout``: a long answer as often as a hung replica."""

    replica_fault = False


class Disconnected(UpstreamError):
    """The replica closed or reset the connection before the response was complete."""


class BadResponse(UpstreamError):
    """The replica's answer is not valid HTTP/1.1."""


__all__ = [
    "BadResponse",
    "ConnectError",
    "ConnectTimeout",
    "Disconnected",
    "ReadTimeout",
    "UpstreamError",
    "UpstreamTimeout",
]
