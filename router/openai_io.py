"""OpenAI wire format: request checks, and turning a finished completion into an SSE stream (error bodies are
:meth:`router.errors.GatewayError.body`).

Checks are hand-written (not pydantic) because they run on every request: the gateway only needs to know
the model, the prompt text for scoring, and whether to stream; everything else passes through untouched.
"""

from __future__ import annotations

from typing import Any

import orjson

from boute.serving.limits import context_error, min_tokens
from router.errors import BadRequest

CHAT, COMPLETION = "chat", "completion"


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise BadRequest(f"{where}[{i}] must be an object", param=where)
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise BadRequest(f"{where}[{i}].text must be a string", param=where)
                parts.append(text)
        return "".join(parts)
    raise BadRequest(f"{where} must be a string or a list of content parts", param=where)


def parse_request(raw: bytes, kind: str) -> tuple[dict[str, Any], str, bool, int]:
    """(body, prompt text used for routing, stream?, characters of input text) or BadRequest naming the
    field. The characters are all messages' text (chat) or the longest prompt (completion, each prompt of a
    list is its own request): what :func:`check_context` bounds the input's tokens by."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    for key in ("max_tokens", "max_completion_tokens", "n"):
        v = body.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise BadRequest(f"'{key}' must be a positive integer", param=key)
    if kind == CHAT:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list", param="messages")
        prompt = ""
        chars = 0
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]")
            text = _text_of(m.get("content"), f"messages[{i}].content")
            chars += len(text)
            if m["role"] == "user":
                prompt = text
        return body, prompt, stream, chars
    prompt_field = body.get("prompt")
    if isinstance(prompt_field, str):
        return body, prompt_field, stream, len(prompt_field)
    if isinstance(prompt_field, list) and prompt_field and all(isinstance(p, str) for p in prompt_field):
        return body, prompt_field[0], stream, max(len(p) for p in prompt_field)
    raise BadRequest("'prompt' must be a string or a non-empty list of strings", param="prompt")


def affinity_text(body: dict[str, Any], kind: str, limit: int) -> str:
    """The prompt as sent, at most ``limit`` characters, for the prefix-affinity keys (a body
    :func:`parse_request` accepted): a chat's messages rendered by :func:`boute.sim.affinity.render_messages`
    (role and text of each, in order), a completion's prompt (a list's first)."""
    if kind == CHAT:
        from boute.sim.affinity import render_messages

        msgs = ((m["role"], _text_of(m.get("content"), "")) for m in body["messages"])
        return render_messages(msgs, limit)
    prompt = body["prompt"]
    return (prompt if isinstance(prompt, str) else prompt[0])[:limit]


def check_context(body: dict[str, Any], kind: str, chars: int, context: int) -> None:
    """BadRequest (400 ``context_length_exceeded``, OpenAI's code; SGLang's message) when the request cannot
    fit a ``context``-token model: ``max_completion_tokens`` (else ``max_tokens``) plus a lower bound of the
    input's tokens from its ``chars`` (:mod:`boute.serving.limits`: the replica refuses the rest itself)."""
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    asked = body.get(key)
    least = min_tokens(chars)
    why = context_error(least, asked, context, estimated=True)
    if why is not None:
        param = key if least < context else ("messages" if kind == CHAT else "prompt")
        raise BadRequest(why, param=param, code="context_length_exceeded")


def response_text(raw: bytes, kind: str) -> str:
    """The generated text of a finished completion ('' when absent)."""
    try:
        choice = orjson.loads(raw)["choices"][0]
        return (choice["message"]["content"] if kind == CHAT else choice["text"]) or ""
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return ""


def wants_usage(body: dict[str, Any]) -> bool:
    """Whether a streamed request asks for the usage-only last chunk (``stream_options.include_usage``)."""
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


def completion_as_sse(raw: bytes, kind: str, usage: bool = False) -> bytes:
    """A finished (non-streamed) completion re-sent as one SSE chunk + [DONE] (cascade, accepted early); with
    ``usage`` (the client asked, :func:`wants_usage`), the usage-only chunk before [DONE], as a stream the
    replica itself sent would end."""
    doc = orjson.loads(raw)
    choices = []
    for c in doc.get("choices", []):
        if kind == CHAT:
            msg = c.get("message") or {}
            delta = {"role": msg.get("role", "assistant"), "content": msg.get("content") or ""}
            choices.append({"index": c.get("index", 0), "delta": delta, "finish_reason": c.get("finish_reason")})
        else:
            choices.append(
                {"index": c.get("index", 0), "text": c.get("text", ""), "finish_reason": c.get("finish_reason")}
            )
    chunk = {
        "id": doc.get("id", "cmpl-boute"),
        "object": "chat.completion.chunk" if kind == CHAT else "text_completion",
        "created": doc.get("created", 0),
        "model": doc.get("model", ""),
        "choices": choices,
    }
    out = b"data: " + orjson.dumps(chunk) + b"\n\n"
    if usage and doc.get("usage") is not None:
        out += b"data: " + orjson.dumps({**chunk, "choices": [], "usage": doc["usage"]}) + b"\n\n"
    return out + b"data: [DONE]\n\n"


# OpenAPI request bodies (the handlers read raw bytes, so FastAPI cannot infer these)
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
}
CHAT_SCHEMA = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string"},
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
        "max_tokens": {"type": "integer", "minimum": 1},
        "stream": {"type": "boolean"},
        "temperature": {"type": "number"},
    },
}
COMPLETION_SCHEMA = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        "model": {"type": "string"},
        "prompt": {"type": "string"},
        "max_tokens": {"type": "integer", "minimum": 1},
        "stream": {"type": "boolean"},
        "temperature": {"type": "number"},
    },
}


def body_spec(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
