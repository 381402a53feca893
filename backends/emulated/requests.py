"""What a client asked an emulated replica, read and checked as SGLang 0.5.23 reads it (its order, its words).

Kept apart from the routes (:mod:`backends.emulated.app`), which submit what is read here to the engine and
answer: a refusal is :class:`RequestRefused`, answered in the shape of the route that refused it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.emulated.profile import chat_pieces, prompt_pieces


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


class RequestRefused(Exception):
    """A request refused with 400; ``kind`` is SGLang's error type for it: "Bad Request" where its request
    model refuses the body (FastAPI validation), "BadRequestError" where its serving code does (context).
    Answered in the shape of the route that refused it: :meth:`openai_response` or :meth:`native_response`."""

    def __init__(self, message: str, kind: str = "Bad Request") -> None:
        super().__init__(message)
        self.kind = kind

    def openai_response(self) -> Response:
        """SGLang's OpenAI error body (``serving_base.create_error_response``)."""
        return json_response(
            {"object": "error", "message": str(self), "type": self.kind, "param": None, "code": 400}, 400
        )

    def native_response(self) -> Response:
        """SGLang's native-route error body (``http_server._create_error_response``)."""
        return json_response({"error": {"message": str(self)}}, 400)


def content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    raise RequestRefused("message content must be a string or a list of parts")


def max_tokens_of(body: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = body.get(k)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise RequestRefused(f"'{k}' must be a positive integer")
            return v
    return None


async def parse_body(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise RequestRefused(f"invalid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestRefused("body must be a JSON object")
    return body


@dataclass(frozen=True, slots=True)
class Asked:
    """An OpenAI completion request as the replica reads it."""

    chat: bool
    prompt: str  # the text answered: the last user message (chat), the first prompt (completion)
    pieces: tuple[str, ...]  # the prompt's tokens, chat template included: its prefix-cache path
    max_tokens: int | None  # the answer's cap (None: the responder's own length)
    stream: bool
    include_usage: bool  # a streamed request's usage-only last chunk (``stream_options.include_usage``)
    model: str  # echoed in the answer: the request's (the gateway sets it to the replica's), else the served name

    @property
    def prompt_tokens(self) -> int:
        return len(self.pieces)


def read_openai(body: dict[str, Any], chat: bool, served: str, fit: Callable[[int, int | None], int | None]) -> Asked:
    """The request's prompt, its tokens and the answer's cap (``fit``: the replica's context rule, given the
    prompt's tokens and the asked cap); RequestRefused (400) on what SGLang refuses. ``served``: the model name
    echoed when the request names none."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise RequestRefused("'messages' must be a non-empty list of objects")
        texts = [content_text(m.get("content")) for m in msgs]
        users = [t for m, t in zip(msgs, texts, strict=True) if m.get("role") == "user"]
        prompt = users[-1] if users else texts[-1]
        roles = [r if isinstance(r := m.get("role"), str) else "user" for m in msgs]
        pieces = tuple(chat_pieces(list(zip(roles, texts, strict=True))))
    else:
        p = body.get("prompt")
        prompt = p[0] if isinstance(p, list) and p and isinstance(p[0], str) else p
        if not isinstance(prompt, str):
            raise RequestRefused("'prompt' must be a string")
        pieces = prompt_pieces(prompt)
    max_tokens = fit(len(pieces), max_tokens_of(body, "max_completion_tokens", "max_tokens"))
    stream = bool(body.get("stream"))
    opts = body.get("stream_options")
    include_usage = stream and isinstance(opts, dict) and bool(opts.get("include_usage"))
    model = body.get("model")
    return Asked(
        chat,
        prompt,
        pieces,
        max_tokens,
        stream,
        include_usage,
        model if isinstance(model, str) else served,
    )
