"""Does the installed uvicorn have what the gateway's fast path builds on? Checked once, at start-up.

:class:`router.http.protocol.GatewayHttpProtocol` subclasses uvicorn's ``HttpToolsProtocol`` and works inside
it: it reads and replaces the connection's current ``cycle``, queues requests on its ``pipeline``, pauses
reading through its ``flow``, registers tasks in its ``tasks``, writes with the module's ``STATUS_LINE`` and
the server's ``default_headers``, and relies on uvicorn starting every request (the first on a connection and
each pipelined one) through ``_start_asgi_task(cycle, app)``. None of this is uvicorn's public API.
``_start_asgi_task`` arrived in 0.45 (with ``--reset-contextvars``); before it, ``on_response_complete``
started the next pipelined request inline as an ASGI cycle, and a queued fast request would crash there.

pyproject.toml bounds uvicorn to the tested range and constraints.txt pins the tested version; this check
covers an install outside them. It does not trust version numbers: it drives a stock protocol instance
through two pipelined requests on a fake transport (no socket, no event loop run) and looks for each internal
it touches. When something is missing the gateway serves every request through uvicorn's stock httptools
protocol (the ASGI path, :func:`router.app.fast_app`: the same answers, more CPU per request) and says so in
one warning line naming what is missing, instead of failing on the first pipelined request.
"""

from __future__ import annotations

import asyncio
import logging
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from router.http.protocol import Completions

log = logging.getLogger("boute.router.http")

#: methods of HttpToolsProtocol the fast path overrides or calls
METHODS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "shutdown",
    "_start_asgi_task",
)
#: per-connection state the fast path reads or replaces
STATE = ("loop", "parser", "cycle", "pipeline", "flow", "tasks", "transport", "server_state", "url", "headers")
STATE_FLAGS = ("expect_100_continue",)
#: what it uses of the connection's FlowControl
FLOW = ("pause_reading", "resume_reading", "drain", "write_paused")

_PROBE = b"GET /probe HTTP/1.1\r\nhost: probe\r\n\r\n"


class _ProbeTransport:
    """Enough of an asyncio transport for a protocol instance that never touches a socket."""

    def __init__(self) -> None:
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes) -> None:
        pass

    def writelines(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _no_app(scope: Any, receive: Any, send: Any) -> None:  # never run: the probe starts no task
    pass


def missing_internals(base: type | None = None, module: ModuleType | None = None) -> list[str]:
    """What of uvicorn's internals the fast path needs is absent from ``base`` (default: the installed
    ``HttpToolsProtocol``) and ``module`` (default: its module); empty when everything is there."""
    if base is None or module is None:
        from uvicorn.protocols.http import httptools_impl

        module = module or httptools_impl
        base = base or httptools_impl.HttpToolsProtocol
    status = getattr(module, "STATUS_LINE", None)
    missing = [] if isinstance(status, dict) and 200 in status else ["httptools_impl.STATUS_LINE"]
    missing += [f"HttpToolsProtocol.{m}()" for m in METHODS if not callable(getattr(base, m, None))]
    if missing:
        return missing
    loop = asyncio.new_event_loop()
    try:
        missing += _drive(base, loop)
    except Exception as exc:  # any surprise in the probe means the internals are not the tested ones
        missing.append(f"a stock connection ({type(exc).__name__}: {exc})")
    finally:
        loop.close()
    return missing


def _drive(base: type, loop: asyncio.AbstractEventLoop) -> list[str]:
    """Two pipelined requests through a stock instance: the first must be started, the second queued on
    ``pipeline`` and started by ``on_response_complete``, both through ``_start_asgi_task``."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    config = Config(app=_no_app, http="httptools", lifespan="off", log_config=None, proxy_headers=False)
    proto = base(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    started: list[object] = []
    proto._start_asgi_task = lambda cycle, app: started.append(cycle)  # instance attribute: shadows the method
    proto.connection_made(_ProbeTransport())
    proto.data_received(_PROBE)
    missing = [f"HttpToolsProtocol.{a}" for a in STATE if getattr(proto, a, None) is None]
    missing += [f"HttpToolsProtocol.{a}" for a in STATE_FLAGS if not hasattr(proto, a)]
    flow = getattr(proto, "flow", None)
    missing += [f"FlowControl.{a}" for a in FLOW if flow is not None and not hasattr(flow, a)]
    if not hasattr(getattr(proto, "server_state", None), "default_headers"):
        missing.append("ServerState.default_headers")
    if missing:
        return missing
    if len(started) != 1:
        return ["on_headers_complete() starting a request through _start_asgi_task"]
    proto.data_received(_PROBE)  # pipelined behind the first, which is still unanswered
    if len(proto.pipeline) != 1:
        return ["a pipelined request queued on HttpToolsProtocol.pipeline"]
    proto.on_response_complete()
    if len(started) != 2:
        return ["on_response_complete() starting the next pipelined request through _start_asgi_task"]
    proto.connection_lost(None)
    return []


def gateway_http(gateway: Completions, base: type | None = None) -> type | str:
    """``uvicorn.Config(http=...)`` for the gateway: the fast protocol bound to ``gateway`` when the installed
    uvicorn (or ``base``, in tests) has its internals, else ``"httptools"`` (uvicorn's stock protocol) after
    one warning line."""
    missing = missing_internals(base)
    if missing:
        import uvicorn

        log.warning(
            "uvicorn %s lacks internals the gateway's fast path uses (%s): serving every request through "
            "uvicorn's stock httptools protocol (slower; install the uvicorn range in pyproject.toml)",
            uvicorn.__version__,
            "; ".join(missing),
        )
        return "httptools"
    from router.http.protocol import gateway_protocol  # imports uvicorn's internals: only once they are known

    return gateway_protocol(gateway)
