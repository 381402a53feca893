"""The gateway's core: wires shared state, balancer, policy and proxy, and serves one completion request.

Kept apart from the FastAPI routes (app.py) so the request path is plain asyncio code that is easy to
read and to time: ``x-boute-overhead-ms`` is the handler's wall time minus the time spent waiting on
upstream replicas and judges.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from boute.serving import BACKENDS, BackendSpec
from boute.serving.relay import RelayResponse
from boute.specs.plan import Plan
from router.balancer import Balancer
from router.config import Settings
from router.metrics import Metrics
from router.openai_io import (
    CHAT,
    BadRequest,
    completion_as_sse,
    error_response,
    parse_request,
    response_text,
)
from router.policy import RoutePolicy
from router.proxy import NoReplica, Proxy, Result, Stream, make_client
from router.state import SharedState

log = logging.getLogger("boute.router")

PATHS = {CHAT: "/v1/chat/completions", "completion": "/v1/completions"}
SSE_HEADERS = {"cache-control": "no-cache"}


class _ClientGone(Exception):
    """The client disconnected while its request body was still arriving."""


async def _wait_disconnect(receive: Any) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return


async def _unless_disconnected(receive: Any, work: Any) -> Any:
    """Await ``work`` in this task; if the client hangs up first, cancel it (closing the upstream request).

    Why not ``asyncio.wait`` on two tasks: that costs a second task plus a waiter future per request.
    Here only the disconnect watcher is a task; when it fires it cancels this task, and the cancellation is
    turned into ``None`` (answered 499) and un-counted so the caller's task is left clean.
    """
    task = asyncio.current_task()
    assert task is not None
    watcher = asyncio.get_running_loop().create_task(_wait_disconnect(receive))
    live = [True]

    def gone(w: asyncio.Task[None]) -> None:
        if live[0] and not w.cancelled():
            live[0] = False
            task.cancel()

    watcher.add_done_callback(gone)
    try:
        return await work
    except asyncio.CancelledError:
        if live[0]:  # cancelled from outside (shutdown): not ours to swallow
            raise
        task.uncancel()
        return None
    finally:
        live[0] = False
        watcher.cancel()


class Gateway:
    def __init__(self, settings: Settings, plan: Plan | None = None, backends: list[BackendSpec] | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics(self)
        self.balancer = Balancer(settings, on_trip=self._tripped)
        self.state = SharedState(settings, self._on_change, self.balancer.mark_down)
        self.policy: RoutePolicy | None = None
        self.inflight = 0
        self.draining = False
        self._initial_plan = plan
        self._initial_backends = backends
        self._tasks: list[asyncio.Task[Any]] = []
        self.client: Any = None  # aiohttp session: created in start(), inside the running loop
        self.proxy: Proxy | None = None
        self._retry = {"retry-after": str(settings.retry_after_s)}

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        from boute.specs import load_plan

        s = self.settings
        plan = self._initial_plan or (load_plan(s.plan) if s.plan else None)
        backends = self._initial_backends
        if backends is None:
            backends = BACKENDS.validate_json(Path(s.backends).read_bytes()) if s.backends else []
        self.client = make_client(s)
        self.proxy = Proxy(self.client, self.balancer, s)
        await self.state.start(plan, backends)
        await self.balancer.check_all(self.client)  # start-up: replicas that do not answer start as down
        self._tasks.append(asyncio.create_task(self.balancer.health_loop(self.client), name="boute-health"))
        # Start-up objects (modules, catalog, pydantic schemas: ~10^5) never die; without freezing, every
        # full collection walks them all and stalls the event loop for tens of ms (seen as p99 latency).
        gc.collect()
        gc.freeze()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.state.stop()
        if self.client is not None:
            await self.client.close()

    def _on_change(self, plan: Plan | None, backends: list[BackendSpec]) -> None:
        if plan is not None and (self.policy is None or self.policy.plan != plan):
            self.policy = RoutePolicy(plan, judge=self._judge())
            log.info("plan applied: %s mode, tiers %s", plan.routing.mode, list(plan.routing.tiers))
        self.balancer.configure(plan, backends)

    def _judge(self) -> Any:
        """Cascade judge: an LLM judge when BOUTE_JUDGE_URL is set, else RoutePolicy's stand-in."""
        if not self.settings.judge_url:
            return None
        from boute.quality import LLMJudge

        return LLMJudge(self.settings.judge_url, self.settings.judge_model, timeout=self.settings.health_timeout_s * 10)

    def _tripped(self, backend_id: str) -> None:
        log.warning("replica %s tripped for %.1fs", backend_id, self.settings.cooldown_s)
        self.state.report_down(backend_id)

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if self.policy is None:
            return False, "no plan loaded"
        counts = self.balancer.healthy_tiers()
        # a tier the plan sends no load to (fraction 0) needs no replica to be ready
        fr = self.policy.plan.routing.fractions
        cascade = self.policy.mode == "cascade"
        loaded = [t for i, t in enumerate(self.policy.tiers) if fr is None or fr[i] > 0 or (cascade and i == 0)]
        missing = [t for t in loaded if counts.get(t, 0) == 0]
        if missing:
            return False, f"no healthy replica for tier(s) {missing}"
        return True, "ready"

    # ---- the request path ---------------------------------------------------------------------
    async def handle(self, request: Request, kind: str) -> Response:
        """The FastAPI route's entry (same path as :meth:`handle_asgi`)."""
        return await self.handle_asgi(request.scope, request.receive, kind)

    async def handle_asgi(self, scope: Any, receive: Any, kind: str) -> Response:
        """Serve one completion request straight from ASGI (no Starlette ``Request`` on the hot path)."""
        t0 = time.perf_counter()
        s = self.settings
        if self.inflight >= s.max_inflight:
            self.metrics.rejected.inc()
            return error_response(
                429, "too many requests in flight; retry later", "rate_limit_exceeded", headers=self._retry
            )
        policy = self.policy
        if policy is None:
            return error_response(503, "no routing plan loaded", headers=self._retry)
        self.inflight += 1
        release = True
        try:
            raw = await self._read_body(scope, receive)
            body, prompt, stream = parse_request(raw, kind)
            forced = policy.resolve_model(body.get("model"))
            if forced is False:
                raise BadRequest(
                    f"unknown model '{body.get('model')}' (known: {', '.join(policy.model_names())})",
                    404,
                    "model",
                    "model_not_found",
                )
            if forced is not None:
                tier, cascade = forced, False
            elif policy.mode == "preroute":
                score = (
                    policy.score_sync(prompt) if policy.cheap else await asyncio.to_thread(policy.score_sync, prompt)
                )
                tier, cascade = policy.tier_for_score(score), False
            else:
                tier, cascade = 0, True
            work = (
                self._cascade(policy, kind, body, prompt, stream)
                if cascade
                else self._single(policy, tier, kind, body, stream)
            )
            outcome = await _unless_disconnected(receive, work)
            if outcome is None:
                return Response(status_code=499)
            result, tier, waited, hops = outcome
            tier_name = policy.tiers[tier]
            headers = {"x-boute-tier": tier_name, "x-boute-replica": result.replica.id}
            if hops > 1:
                headers["x-boute-hops"] = str(hops)
            overhead = time.perf_counter() - t0 - waited
            headers["x-boute-overhead-ms"] = f"{overhead * 1e3:.3f}"
            self.metrics.observe(tier_name, result.status if isinstance(result, Result) else 200, overhead)
            if isinstance(result, Stream):
                release = False
                return RelayResponse(
                    self._release_after(self.proxy.relay(result)), 200, {**headers, **SSE_HEADERS}, "text/event-stream"
                )
            if stream and result.status == 200:  # cascade accepted a non-final tier: re-send as SSE
                return Response(
                    completion_as_sse(result.body, kind), 200, {**headers, **SSE_HEADERS}, "text/event-stream"
                )
            return Response(result.body, result.status, headers, "application/json")
        except _ClientGone:
            return Response(status_code=499)
        except BadRequest as exc:
            self.metrics.count("-", exc.status)
            return error_response(exc.status, exc.message, exc.kind, exc.param, exc.code)
        except NoReplica as exc:
            self.metrics.count("-", 503)
            return error_response(503, str(exc), "service_unavailable", headers=self._retry)
        finally:
            if release:
                self.inflight -= 1

    async def _read_body(self, scope: Any, receive: Any) -> bytes:
        limit = self.settings.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.isdigit() and int(value) > limit:
                    raise BadRequest(f"request body exceeds {limit} bytes", 413, code="request_too_large")
                break
        msg = await receive()
        if msg["type"] != "http.request":
            raise _ClientGone
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
                raise _ClientGone
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BadRequest(f"request body exceeds {limit} bytes", 413, code="request_too_large")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(chunks)

    async def _release_after(self, chunks: Any) -> Any:
        try:
            async for c in chunks:
                yield c
        finally:
            self.inflight -= 1
            await chunks.aclose()

    async def _single(self, policy: RoutePolicy, tier: int, kind: str, body: dict[str, Any], stream: bool) -> Any:
        name = policy.tiers[tier]
        if stream:
            out: Stream | Result = await self.proxy.open_stream(name, PATHS[kind], body)
        else:
            out = await self.proxy.complete(name, PATHS[kind], body)
        return out, tier, out.upstream_s, 1

    async def _cascade(self, policy: RoutePolicy, kind: str, body: dict[str, Any], prompt: str, stream: bool) -> Any:
        """Tier 0 answers; the judge scores it; below the hop's threshold the next tier answers."""
        last = len(policy.tiers) - 1
        waited = 0.0
        inner = {**body, "stream": False} if stream else body
        for hop in range(last + 1):
            name = policy.tiers[hop]
            if hop == last and stream:
                out = await self.proxy.open_stream(name, PATHS[kind], body)
                return out, hop, waited + out.upstream_s, hop + 1
            res = await self.proxy.complete(name, PATHS[kind], inner)
            waited += res.upstream_s
            if hop == last or res.status != 200:
                return res, hop, waited, hop + 1
            t = time.perf_counter()
            score = await policy.judge.ajudge(prompt, response_text(res.body, kind))
            waited += time.perf_counter() - t
            if policy.accepts(hop, score):
                return res, hop, waited, hop + 1
            self.metrics.escalations.inc()
        raise AssertionError("unreachable")
