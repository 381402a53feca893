"""HTTP face of the emulated backend: OpenAI (/v1/...) and SGLang-native (/generate, /get_model_info) API.

Plain Starlette (no per-request pydantic) so the backend's own CPU cost stays small next to the gateway's
when both are measured on one machine. A client that disconnects cancels its sequence in the engine. A
request that cannot fit the model's context (``max_context`` in the catalog) is refused with 400, in
SGLang's words, before any work. With ``BOUTE_REPLICA_TOKEN`` set, requests without its bearer header get
401 as SGLang's ``--api-key`` answers them (:mod:`boute.serving.auth`; health probes stay open).

The bodies follow SGLang 0.5.23 as served on this CPU (``tests/test_sglang_contract.py`` holds them to SGLang's
own protocol models, and docs/sglang.md lists what was compared): errors of the OpenAI routes are SGLang's
``ErrorResponse`` (``{"object": "error", "message", "type", "param", "code": 400}``, no ``error`` wrapper),
those of ``/generate`` ``{"error": {"message"}}``; ``model`` echoes the request's; every choice, delta and usage
carries SGLang's null/zero fields; ``stream_options.include_usage`` adds the usage-only last chunk.

Prefix-cache hits (:mod:`backends.emulated.engine`) are reported as SGLang 0.5.23 reports them: ``/generate``'s
``meta_info.cached_tokens`` always (``cached_tokens_details``: ``{"device": hit, "host": 0}``, null without a
hit), the OpenAI routes' ``usage.prompt_tokens_details`` as ``{"cached_tokens": hit}`` only with
``--enable-cache-report`` (``ReplicaConfig.enable_cache_report``), else null (SGLang's ``UsageProcessor``),
in the whole answer and in a stream's usage chunk alike.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.emulated.engine import Engine, Sequence
from backends.emulated.profile import ReplicaConfig, Responder, prompt_pieces
from backends.emulated.requests import Asked, RequestRefused, json_response, max_tokens_of, parse_body, read_openai
from boute.serving.auth import UNAUTHORIZED_BODY, UNAUTHORIZED_STATUS, authorized, open_path, replica_token
from boute.serving.limits import context_error
from boute.serving.relay import RelayResponse  # closes the generator on disconnect, which cancels the sequence

_ids = itertools.count(1)


#: SGLang's usage fields beyond the three counts and the cache report (no reasoning parser: zero and null)
_USAGE_EXTRA: dict[str, Any] = {"reasoning_tokens": 0, "completion_tokens_details": None}


@dataclass(frozen=True, slots=True)
class _Answer:
    """What the replica generates for an OpenAI request: the sequence in the engine, and the fields of the
    answer fixed when it was submitted."""

    seq: Sequence
    rid: str
    created: int
    finish: str  # "length" when the cap cut it, else "stop"
    cache_report: bool  # SGLang's --enable-cache-report

    def usage(self) -> dict[str, Any]:
        """SGLang's usage once the sequence was admitted (its cache hit is known from then on)."""
        seq = self.seq
        details = {"cached_tokens": seq.cached} if self.cache_report else None
        return {
            "prompt_tokens": seq.input_tokens,
            "completion_tokens": seq.output_tokens,
            "total_tokens": seq.input_tokens + seq.output_tokens,
            "prompt_tokens_details": details,
            **_USAGE_EXTRA,
        }


class RequireToken:
    """ASGI middleware: SGLang's ``--api-key`` rule (:func:`boute.serving.auth.open_path`, 401 otherwise)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not open_path(scope["method"], scope["path"]):
            header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if not authorized(header, self.token):
                length = str(len(UNAUTHORIZED_BODY)).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", length)]
                await send({"type": "http.response.start", "status": UNAUTHORIZED_STATUS, "headers": headers})
                await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})
                return
        await self.app(scope, receive, send)


class ReplicaApi:
    """One emulated replica's routes over its engine. A completion request goes through named steps: read it
    (SGLang's checks, in its order), submit its answer to the engine, then answer whole or as a stream."""

    def __init__(self, cfg: ReplicaConfig) -> None:
        from boute.catalog import builtin_catalog, load_catalog_file
        from boute.perf import replica_perf

        # the plan's own catalog (scenario-defined hardware, calibrated factors): timed as the optimiser timed it
        cat = load_catalog_file(cfg.catalog) if cfg.catalog else builtin_catalog()
        perf = replica_perf(cat.model(cfg.model), cat.gpu(cfg.gpu), tp=cfg.tp, pp=cfg.pp, dtype=cfg.dtype)
        self.cfg = cfg
        self.responder = Responder(cfg)
        self.engine = Engine(perf, speedup=cfg.speedup, max_running=cfg.max_running)
        self.name = cfg.name
        self.context = cat.model(cfg.model).max_context
        self.started = int(time.time())

    def routes(self) -> list[Route]:
        return [
            Route("/v1/chat/completions", self.openai, methods=["POST"]),
            Route("/v1/completions", self.openai, methods=["POST"]),
            Route("/generate", self.generate, methods=["POST"]),
            Route("/v1/models", self.models),
            Route("/health", self.health),
            Route("/health_generate", self.health),
            Route("/get_model_info", self.model_info),
            Route("/model_info", self.model_info),
            Route("/get_server_info", self.server_info),
            Route("/server_info", self.server_info),
        ]

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.engine.start()
        try:
            yield
        finally:
            await self.engine.stop()

    # ---- shared steps -------------------------------------------------------------------------
    def _fit(self, prompt_tokens: int, max_tokens: int | None) -> int | None:
        """SGLang's context rule (:mod:`boute.serving.limits`): RequestRefused (400, its message) when the request cannot
        fit; else the answer's cap, which without ``max_tokens`` is the room left in the context (SGLang stops
        there with finish reason ``length``). Checked before the answer is built: an answer of 10^8 pieces took
        minutes of CPU and blocked every replica of the process, health checks included (issue 28)."""
        why = context_error(prompt_tokens, max_tokens, self.context)
        if why is not None:
            raise RequestRefused(why, "BadRequestError")
        room = self.context - prompt_tokens
        return max_tokens if max_tokens is not None or self.cfg.default_output_tokens <= room else room

    async def _wait_or_cancel(self, request: Request, seq: Sequence) -> bool:
        """Wait for a non-streamed sequence; False (and cancelled) if the client went away first."""

        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        watcher = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({seq.done, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not seq.done.done():
            self.engine.cancel(seq)
            return False
        return True

    # ---- OpenAI API ---------------------------------------------------------------------------
    async def openai(self, request: Request) -> Response:
        """``/v1/chat/completions`` and ``/v1/completions``."""
        t_in = time.perf_counter()
        chat = request.url.path.endswith("/chat/completions")
        try:
            asked = read_openai(await parse_body(request), chat, self.name, self._fit)
        except RequestRefused as exc:
            return exc.openai_response()
        answer = self._submit(asked)
        if not asked.stream:
            return await self._whole(request, asked, answer, t_in)
        return RelayResponse(self._events(asked, answer), media_type="text/event-stream")

    def _submit(self, asked: Asked) -> _Answer:
        """Build the answer's pieces and hand them to the engine, which emits them on its clock."""
        out, truncated = self.responder.answer(asked.prompt, asked.max_tokens)
        seq = self.engine.submit(out, asked.prompt_tokens, asked.stream, asked.pieces)
        rid, created = f"{'chatcmpl' if asked.chat else 'cmpl'}-emu{next(_ids)}", int(time.time())
        return _Answer(seq, rid, created, "length" if truncated else "stop", self.cfg.enable_cache_report)

    async def _whole(self, request: Request, asked: Asked, answer: _Answer, t_in: float) -> Response:
        """The whole answer once the engine has emitted it (499 when the client left first)."""
        if not await self._wait_or_cancel(request, answer.seq):
            return Response(status_code=499)
        text = answer.seq.text()
        finish = answer.finish
        message = {"role": "assistant", "content": text, "reasoning_content": None}
        choice: dict[str, Any] = (
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish, "matched_stop": None}
            if asked.chat
            else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}
        )
        # service_ms: time inside this handler, so a bench can subtract the backend's own (modelled,
        # load-dependent) time from client latency and compare proxies without that noise
        service_ms = round((time.perf_counter() - t_in) * 1e3, 3)
        usage = answer.usage()
        return json_response(
            {
                "id": answer.rid,
                "object": "chat.completion" if asked.chat else "text_completion",
                "created": answer.created,
                "model": asked.model,
                "choices": [choice],
                "usage": usage,
                # SGLang's weight-version record (one version, "default", for every token)
                "metadata": {
                    "weight_version": "default",
                    "weight_versions": [{"version": "default", "start": 0, "end": usage["completion_tokens"]}],
                },
                "service_ms": service_ms,
            }
        )

    async def _events(self, asked: Asked, answer: _Answer) -> AsyncIterator[bytes]:
        """The answer as SGLang streams it: a role chunk (chat), a chunk per token, the finish chunk, the
        usage-only chunk when asked, ``[DONE]``. Closing it frees the batch slot of a client that left."""
        chat, seq = asked.chat, answer.seq
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = b'{"id":"%s","object":"%s","created":%d,"model":%s,"choices":[' % (
            answer.rid.encode(),
            obj.encode(),
            answer.created,
            orjson.dumps(asked.model),
        )
        # completion chunks carry "usage": null, chat chunks no usage key (as SGLang's do)
        tail = b"]}\n\n" if chat else b'],"usage":null}\n\n'
        try:
            if chat:
                yield (
                    b"data: "
                    + head
                    + b'{"index":0,"delta":{"reasoning_content":null,"role":"assistant","content":""},'
                    + b'"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n\n'
                )
            q = seq.stream
            assert q is not None
            while (piece := await q.get()) is not None:
                yield _chunk(head, tail, chat, piece, None)
            yield _chunk(head, tail, chat, None, answer.finish)
            if asked.include_usage:  # SGLang: a last chunk with no choices and the usage
                yield b"data: " + head + b'],"usage":' + orjson.dumps(answer.usage()) + b"}\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            self.engine.cancel(seq)  # no-op once finished; frees the batch slot when the client left

    # ---- SGLang native API --------------------------------------------------------------------
    async def generate(self, request: Request) -> Response:
        """SGLang native: {"text", "sampling_params": {"max_new_tokens"}, "stream"}."""
        try:
            body = await parse_body(request)
            prompt = body.get("text")
            if not isinstance(prompt, str):
                raise RequestRefused("'text' must be a string")
            sp = body.get("sampling_params") or {}
            if not isinstance(sp, dict):
                raise RequestRefused("'sampling_params' must be an object")
            pieces = prompt_pieces(prompt)
            prompt_tokens = len(pieces)
            max_tokens = self._fit(prompt_tokens, max_tokens_of(sp, "max_new_tokens"))
        except RequestRefused as exc:
            return exc.native_response()
        out, truncated = self.responder.answer(prompt, max_tokens)
        stream = bool(body.get("stream"))
        seq = self.engine.submit(out, prompt_tokens, stream, pieces)
        rid, t0 = f"emu{next(_ids)}", time.perf_counter()

        def meta(done: bool) -> dict[str, Any]:
            fin = ({"type": "length", "length": len(out)} if truncated else {"type": "stop"}) if done else None
            m = {"id": rid, "finish_reason": fin, "prompt_tokens": prompt_tokens, "weight_version": "default"}
            # SGLang's cache report on this route is unconditional; the details null without a hit
            details = {"device": seq.cached, "host": 0} if seq.cached else None
            m.update(completion_tokens=seq.emitted, cached_tokens=seq.cached, cached_tokens_details=details)
            if done:
                m["e2e_latency"] = time.perf_counter() - t0
            return m

        if not stream:
            if not await self._wait_or_cancel(request, seq):
                return Response(status_code=499)
            return json_response({"text": seq.text(), "meta_info": meta(True)})

        async def events() -> AsyncIterator[bytes]:
            try:
                q = seq.stream
                assert q is not None
                while await q.get() is not None:
                    yield b"data: " + orjson.dumps({"text": seq.text(), "meta_info": meta(False)}) + b"\n\n"
                yield b"data: " + orjson.dumps({"text": seq.text(), "meta_info": meta(True)}) + b"\n\n"
                yield b"data: [DONE]\n\n"
            finally:
                self.engine.cancel(seq)

        return RelayResponse(events(), media_type="text/event-stream")

    # ---- model and server info ----------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        name = self.name
        card = {"id": name, "object": "model", "created": self.started, "owned_by": "sglang", "root": name}
        return json_response({"object": "list", "data": [{**card, "parent": None, "max_model_len": self.context}]})

    async def health(self, request: Request) -> Response:
        return Response(b"", 200)

    async def model_info(self, request: Request) -> Response:
        name = self.name
        return json_response(
            {
                "model_path": name,
                "served_model_name": name,
                "tokenizer_path": name,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
            }
        )

    async def server_info(self, request: Request) -> Response:
        engine = self.engine
        return json_response(
            {
                **self.cfg.model_dump(),
                "context_length": self.context,
                "kv_capacity_tokens": engine.kv_capacity,
                "running": len(engine.running),
                "waiting": len(engine.waiting),
                "iterations": engine.iterations,
                "tokens_out": engine.tokens_out,
                # the prefix cache since start: prompt tokens it held (hit) of those asked (lookup), evicted
                "cache_hit_tokens": engine.cache.hit_tokens,
                "cache_lookup_tokens": engine.cache.lookup_tokens,
                "cache_evicted_tokens": engine.cache.evicted_tokens,
                "cache_held_tokens": engine.cache.held,
            }
        )


def _chunk(head: bytes, tail: bytes, chat: bool, piece: str | None, fin: str | None) -> bytes:
    """One SSE chunk of a streamed OpenAI answer: a token (``piece``), or the finish chunk (``fin``)."""
    if chat:
        delta = {"reasoning_content": None} if piece is None else {"reasoning_content": None, "content": piece}
        c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": fin, "matched_stop": None}
    else:
        c = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": fin, "matched_stop": None}
    return b"data: " + head + orjson.dumps(c) + tail


def create_app(cfg: ReplicaConfig, token: str | None = None) -> Starlette:
    """The replica's app; ``token`` (default: ``BOUTE_REPLICA_TOKEN``) makes it refuse requests without it."""
    api = ReplicaApi(cfg)
    token = token or replica_token()
    guard = [Middleware(RequireToken, token=token)] if token else []
    app = Starlette(routes=api.routes(), lifespan=api.lifespan, middleware=guard)
    app.state.engine = api.engine
    return app
