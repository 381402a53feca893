"""Reading a request body from ASGI under a size limit, without holding more than the limit."""

from __future__ import annotations

from typing import Any

from router.openai_io import BadRequest
from router.reply import ClientGone


async def read_body(scope: Any, receive: Any, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes: from its
    Content-Length before anything is read, else as the chunks arrive (at most one chunk past the limit is
    read).
    :class:`router.reply.ClientGone` when the client disconnects before the body is whole."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            if value.isdigit() and int(value) > limit:
                raise BadRequest(f"request body exceeds {limit} bytes", 413, code="request_too_large")
            break
    msg = await receive()
    if msg["type"] != "http.request":
        raise ClientGone
    body = msg.get("body", b"")
    if not msg.get("more_body", False):  # the usual case: the whole body in one message
        if len(body) > limit:
            raise BadRequest(f"request body exceeds {limit} bytes", 413, code="request_too_large")
        return body
    chunks = [body]
    size = len(body)
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise ClientGone
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"request body exceeds {limit} bytes", 413, code="request_too_large")
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return b"".join(chunks)
