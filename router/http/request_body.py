"""Reading a request body under a size limit, without holding more than the limit."""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import Receive, Scope

from router.errors import BodyTooLarge, ClientGone


def declared_too_large(headers: Iterable[tuple[bytes, bytes]], limit: int) -> bool:
    """Whether the request's Content-Length already says its body exceeds ``limit`` bytes (then it is refused
    before a byte of it is read); False without one (a chunked body is counted as it arrives)."""
    for name, value in headers:
        if name == b"content-length":
            return value.isdigit() and int(value) > limit
    return False


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body from ASGI, refused (:class:`~router.errors.BodyTooLarge`) as soon as it is known to
    exceed ``limit`` bytes: from its Content-Length before anything is read, else as the chunks arrive (at
    most one chunk past the limit is read). :class:`~router.errors.ClientGone` when the client disconnects
    before the body is whole."""
    if declared_too_large(scope["headers"], limit):
        raise BodyTooLarge(limit)
    msg = await receive()
    if msg["type"] != "http.request":
        raise ClientGone
    body: bytes = msg.get("body", b"")
    if not msg.get("more_body", False):  # the usual case: the whole body in one message
        if len(body) > limit:
            raise BodyTooLarge(limit)
        return body
    chunks = [body]
    size = len(body)
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise ClientGone
        chunk: bytes = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(chunks)
