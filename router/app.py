"""FastAPI app factory: the OpenAI-compatible endpoints, health/readiness, metrics and admin.

Every error, including framework ones (unknown route, wrong method), is answered in OpenAI's JSON error
shape so OpenAI clients surface a readable message.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from boute.errors import BouteError, from_validation_error
from boute.serving import BACKENDS, BackendSpec
from boute.specs.plan import Plan
from router.config import Settings
from router.errors import AdminDisabled, GatewayError, InternalError, NotAuthenticated, Unprocessable
from router.gateway import Gateway
from router.http.reply import Reply
from router.openai_io import CHAT, CHAT_SCHEMA, COMPLETION, COMPLETION_SCHEMA, body_spec

PLAN_SCHEMA = {"type": "object", "description": "a BOute plan (see docs/router.md)"}
BACKENDS_SCHEMA = {"type": "array", "items": {"type": "object"}, "description": "list of BackendSpec"}


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


def create_app(
    settings: Settings | None = None, plan: Plan | None = None, backends: list[BackendSpec] | None = None
) -> FastAPI:
    """A gateway app; ``plan``/``backends`` given here win over the files named in ``settings``."""
    settings = settings or Settings.from_env()
    gw = Gateway(settings, plan, backends)
    app = FastAPI(title="BOute gateway", version="0.1.0", lifespan=_lifespan(gw), docs_url=None, redoc_url=None)
    app.state.gateway = gw
    _answer_errors(app)
    _openai_routes(app, gw)
    _operation_routes(app, gw)
    _admin_routes(app, gw, settings)
    return app


def _lifespan(gw: Gateway) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The gateway starts with the app (replicas checked, shared state followed) and stops with it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    return lifespan


def _answer_errors(app: FastAPI) -> None:
    """Every error in OpenAI's shape (:meth:`router.http.reply.Reply.failed`): the gateway's own, and the
    framework's (unknown route, wrong method, a request FastAPI could not validate)."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> Response:
        return Reply.failed(exc).response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        code = "not_found" if exc.status_code == 404 else None
        headers = getattr(exc, "headers", None)
        return Reply.failed(
            GatewayError(str(exc.detail), status=exc.status_code, code=code, headers=headers)
        ).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return Reply.failed(Unprocessable(f"invalid request: {exc.errors()[0].get('msg', 'invalid')}")).response()


def _openai_routes(app: FastAPI, gw: Gateway) -> None:
    @app.post("/v1/chat/completions", openapi_extra=body_spec(CHAT_SCHEMA))
    async def chat_completions(request: Request) -> Response:
        """OpenAI chat completions, routed to a tier (``model``: ``boute`` = automatic, ``router-<tier>``)."""
        return await gw.handle(request, CHAT)

    @app.post("/v1/completions", openapi_extra=body_spec(COMPLETION_SCHEMA))
    async def completions(request: Request) -> Response:
        """OpenAI text completions, routed like chat completions."""
        return await gw.handle(request, COMPLETION)

    @app.get("/v1/models")
    async def models() -> Response:
        names = gw.policy.model_names() if gw.policy is not None else []
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "boute"} for n in names]
        return _json({"object": "list", "data": data})


def _operation_routes(app: FastAPI, gw: Gateway) -> None:
    @app.get("/health")
    async def health() -> Response:
        """Liveness: the process answers."""
        return _json({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: a plan is loaded and every tier has at least one healthy replica."""
        ok, reason = gw.ready()
        return _json({"ready": ok, "reason": reason}, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4")


def _admin_routes(app: FastAPI, gw: Gateway, settings: Settings) -> None:
    """``/admin/*``: read and replace the plan and the backend registry, behind ``BOUTE_ADMIN_TOKEN``."""

    def _auth(request: Request) -> None:
        token = settings.admin_token
        if not token:
            raise AdminDisabled
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise NotAuthenticated

    @app.get("/admin/plan")
    async def get_plan(request: Request) -> Response:
        _auth(request)
        plan = gw.state.plan
        data = plan.model_dump(mode="json", exclude_none=True) if plan is not None else None
        doc = {"version": gw.state.plan_version, "plan": data, "shared": gw.state.connected}
        return _json(doc | {"refused": gw.plan_error} if gw.plan_error else doc)

    @app.put("/admin/plan", openapi_extra=body_spec(PLAN_SCHEMA))
    async def put_plan(request: Request) -> Response:
        """Replace the live plan on every instance; an invalid plan is a 422 and the old one stays."""
        _auth(request)
        try:
            plan = Plan.model_validate_json(await request.body())
            # compiled before it is shared: router files present and verified, hardware in the plan's catalog;
            # its bundle files go to the shared store with it, so every peer can load it too
            files = await asyncio.to_thread(gw.plan_files, plan)
        except ValidationError as exc:
            raise Unprocessable(str(from_validation_error(exc, "plan")), code="invalid_plan") from None
        except BouteError as exc:
            raise Unprocessable(str(exc), code="invalid_plan") from None
        version = await gw.state.put_plan(plan, files)
        return _json({"version": version, "tiers": list(plan.routing.tiers), "mode": plan.routing.mode})

    @app.get("/admin/backends")
    async def get_backends(request: Request) -> Response:
        _auth(request)
        now = time.monotonic()
        return _json({"backends": [r.as_dict(now) for r in gw.balancer.by_id.values()], "shared": gw.state.connected})

    @app.put("/admin/backends", openapi_extra=body_spec(BACKENDS_SCHEMA))
    async def put_backends(request: Request) -> Response:
        """Replace the backend registry (a deployer registers replicas here)."""
        _auth(request)
        try:
            backends = BACKENDS.validate_json(await request.body())
        except ValidationError as exc:
            raise Unprocessable(str(from_validation_error(exc, "backends")), code="invalid_backends") from None
        await gw.state.put_backends(backends)
        await gw.check_replicas()
        return _json({"backends": len(backends)})


def fast_app(app: FastAPI) -> ASGIApp:
    """ASGI wrapper that sends the two completion endpoints straight to the gateway.

    Why: FastAPI's routing and dependency solving cost more per request than the rest of the gateway;
    the FastAPI routes stay for everything else and for the OpenAPI spec (same handler behind both).
    """
    hot = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETION}
    gw: Gateway = app.state.gateway

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and (kind := hot.get(scope["path"])) is not None:
            try:
                response = await gw.handle_asgi(scope, receive, kind)
            except Exception as exc:  # never a bare 500 page: keep the OpenAI error shape
                response = Reply.failed(InternalError(exc)).response()
            await response(scope, receive, send)
            return
        await app(scope, receive, send)

    return asgi
