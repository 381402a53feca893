"""Every error the gateway raises, in one tree.

::

    GatewayError                  answered to the client in OpenAI's error shape (status, type, code, headers)
    ├── BadRequest                400 invalid_request_error: the client's mistake, ``param`` names the field
    │   ├── BodyTooLarge          413 request_too_large: the body is over ``max_body_bytes``
    │   └── UnknownModel          404 model_not_found: ``model`` names no tier and is not automatic routing
    ├── NotAuthenticated          401 authentication_error: admin API, missing or wrong bearer token
    ├── AdminDisabled             403 permission_error: admin API, no ``BOUTE_ADMIN_TOKEN`` set
    ├── Unprocessable             422: an admin document (plan, backends) that does not validate
    ├── Overloaded                429 rate_limit_exceeded + Retry-After: a bound is reached, shed at once
    ├── NoPlan                    503 + Retry-After: no routing plan loaded yet
    ├── NoReplica                 503 service_unavailable + Retry-After: every replica of the tier down or failed
    ├── SharedStateUnavailable    503 service_unavailable + Retry-After: Redis cannot be written
    ├── Unanswered                504 upstream_timeout: the replica took the request and then sent nothing
    └── InternalError             500: a bug; the client still gets the error shape, never a bare page
    ClientGone                    the client left before its request was whole (answered 499, no body)
    UpstreamError                 an upstream call failed; never answered as such (router.proxy retries it on
    │                             another replica, or answers NoReplica / Unanswered)
    ├── ConnectError              no connection could be made (``refused``: the port actively refused it)
    ├── UpstreamTimeout
    │   ├── ConnectTimeout        no connection within ``connect_timeout``
    │   └── ReadTimeout           no byte for ``read_timeout``: the request's length as often as the replica's
    ├── Disconnected              the replica closed or reset the connection mid-response
    └── BadResponse               the replica's answer is not valid HTTP/1.1

One handler turns a :class:`GatewayError` into its answer (:meth:`router.http.reply.Reply.failed`), on the
completion fast path and on the FastAPI routes alike; its body is :meth:`GatewayError.body`.

Why a read timeout is not the replica's fault (``replica_fault`` False): the gateway charges a replica's
circuit breaker for a failure and retries the request on another replica of the tier. That is right when the
failure is the replica's: it refused or dropped the connection, sent garbage, could not be reached in time. It
is wrong when the request itself is what takes long: a read timeout on a non-streamed request is most often a
long answer being generated. Charging it, one heavy request charges every replica it is retried on, a few of
them trip the whole tier, and each retry repeats the heavy work elsewhere (issue 28). So such a failure is the
request's: not charged, not retried; the client gets a 504 (:class:`Unanswered`). A replica that is really
hung is still found by the active health checks and by the connection-level failures of other requests.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson


def retry_after(seconds: int) -> dict[str, str]:
    """The ``Retry-After`` header of an answer that asks the client to come back in ``seconds``."""
    return {"retry-after": str(seconds)}


class GatewayError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

    A subclass fixes its :attr:`status`, :attr:`kind` and :attr:`code`; each may also be given per instance.
    """

    #: the HTTP status of the answer
    status: int = 500
    #: OpenAI's error ``type``; empty: by status, ``invalid_request_error`` below 500 (the client's fault),
    #: else ``server_error``
    kind: str = ""
    #: OpenAI's error ``code``: a stable name a client can branch on
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int | None = None,
        kind: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        #: the request field at fault, if one is
        self.param = param
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code
        self.kind = kind or self.kind or ("invalid_request_error" if self.status < 500 else "server_error")
        #: extra response headers (e.g. Retry-After)
        self.headers = headers

    def body(self) -> bytes:
        """The answer's JSON body."""
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return orjson.dumps({"error": error})


class BadRequest(GatewayError):
    """A client mistake: a malformed body, a field of the wrong type, a request that cannot fit a context."""

    status = 400


class BodyTooLarge(BadRequest):
    """The request body is over the gateway's ``max_body_bytes``: refused before it is kept whole."""

    status = 413
    code = "request_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body exceeds {limit} bytes")


class UnknownModel(BadRequest):
    """``model`` names neither a tier, nor a tier's model, nor automatic routing."""

    status = 404
    code = "model_not_found"

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown model '{name}' (known: {', '.join(known)})", param="model")


class NotAuthenticated(GatewayError):
    """An admin request without the admin bearer token."""

    status = 401
    kind = "authentication_error"

    def __init__(self) -> None:
        super().__init__("missing or wrong bearer token")


class AdminDisabled(GatewayError):
    """The admin API is off: no admin token is configured."""

    status = 403
    kind = "permission_error"

    def __init__(self) -> None:
        super().__init__("admin API disabled: set BOUTE_ADMIN_TOKEN")


class Unprocessable(GatewayError):
    """A well-formed request whose document does not validate (``code`` names which: ``invalid_plan``, ...)."""

    status = 422


class Overloaded(GatewayError):
    """A bound is reached: answered at once with Retry-After, instead of letting the request wait past its
    client's timeout. ``reason`` names the bound (``inflight``, ``tier_queue``, ``scoring``)."""

    status = 429
    kind = "rate_limit_exceeded"

    def __init__(self, reason: str, why: str, headers: Mapping[str, str]) -> None:
        super().__init__(f"{why}; retry later", headers=headers)
        self.reason = reason


class NoPlan(GatewayError):
    """No routing plan is loaded yet (none at start-up and none in the shared store)."""

    status = 503

    def __init__(self, headers: Mapping[str, str]) -> None:
        super().__init__("no routing plan loaded", headers=headers)


class UpstreamFailure(GatewayError):
    """The tier a request was sent to could not answer it. ``tier``: that tier; ``taken``: a replica took the
    request (its answer is counted under the tier) rather than none being able to."""

    taken = False

    def __init__(self, tier: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message, headers=headers)
        self.tier = tier


class NoReplica(UpstreamFailure):
    """Every replica of the tier is down or failed for this request."""

    status = 503
    kind = "service_unavailable"

    def __init__(self, tier: str, tried: int, last: str | None, headers: Mapping[str, str]) -> None:
        detail = f"; last error: {last}" if last else ""
        message = f"no healthy replica of tier '{tier}' could serve the request (tried {tried}){detail}"
        super().__init__(tier, message, headers)
        self.tried, self.last = tried, last


class Unanswered(UpstreamFailure):
    """The replica took the request and then sent nothing for the read timeout: not retried (another replica
    would take as long over the same request, and the work would be repeated), not charged (answered 504)."""

    status = 504
    code = "upstream_timeout"
    taken = True

    def __init__(self, tier: str, replica: str, why: str) -> None:
        super().__init__(tier, f"replica {replica} of tier '{tier}' did not answer in time ({why}); not retried")


class SharedStateUnavailable(GatewayError):
    """Redis is configured but cannot be written: the change would not reach the other instances."""

    status = 503
    kind = "service_unavailable"

    def __init__(self, why: object) -> None:
        super().__init__(f"shared state unavailable: {why}", headers=retry_after(1))


class InternalError(GatewayError):
    """An exception no handler expected: still answered in OpenAI's shape, naming only its type."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"internal error: {type(exc).__name__}")


class ClientGone(Exception):
    """The client disconnected while its request body was still arriving."""


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
