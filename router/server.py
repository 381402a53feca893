"""Run the gateway with uvicorn: uvloop + httptools, graceful drain on SIGTERM/SIGINT; one process, or a
supervisor and N worker processes on one port (``--workers N``, :mod:`router.workers`).

Drain: uvicorn stops accepting connections on the signal, then waits up to ``drain_timeout_s`` for
in-flight requests (streams included) to finish before the lifespan shutdown closes upstream clients.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import socket
import sys
from pathlib import Path

from router.config import Settings, workers_problem


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "warning",
    worker: tuple[socket.socket, Path] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM. ``worker``: as one of several workers on this port, on this SO_REUSEPORT
    socket, its metrics merged through the run folder (where it writes ``<pid>.ready`` once listening)."""
    import uvicorn

    from router.app import create_app, fast_app
    from router.http.uvicorn_compat import gateway_http

    app = create_app(settings)
    config = uvicorn.Config(
        fast_app(app),
        host=host,
        port=port,
        loop="uvloop",
        # httptools; completion requests served from the parser callbacks, one write per response (the stock
        # httptools protocol, with one warning, where the installed uvicorn lacks the internals: uvicorn_compat)
        http=gateway_http(app.state.gateway),
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
        backlog=4096,
        timeout_keep_alive=30,
        proxy_headers=False,
        lifespan="on",
    )
    if worker is None:
        uvicorn.Server(config).run()
        return
    from router.worker_metrics import WorkerMetrics
    from router.workers import WorkerServer

    sock, worker_dir = worker
    gw = app.state.gateway
    fleet = WorkerMetrics(worker_dir, gw.metrics.registry, lambda: gw.state.plan_version)
    gw.metrics.fleet = fleet
    WorkerServer(config, fleet).run(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m router", description="BOute gateway (settings also from BOUTE_* env)")
    ap.add_argument("--plan")
    ap.add_argument("--backends")
    ap.add_argument("--redis", dest="redis_url")
    ap.add_argument("--redis-prefix")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--workers", type=int, help="worker processes on the port (more than one needs --redis)")
    ap.add_argument("--worker-dir", type=Path, help=argparse.SUPPRESS)  # set by the supervisor for its workers
    ap.add_argument("--log-level", default="warning")
    ap.add_argument(
        "--affinity",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="prefix-affinity balancing on/off, over the plan's 'affinity' section (default: as the plan says)",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = Settings.from_env(
        plan=args.plan,
        backends=args.backends,
        redis_url=args.redis_url,
        redis_prefix=args.redis_prefix,
        workers=args.workers,
        affinity=args.affinity,
    )
    if args.worker_dir is not None:  # one of several: the supervisor checked the plan
        return _worker(settings, args.host, args.port, args.log_level, args.worker_dir)
    problem = workers_problem(settings.workers, settings.redis_url)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if settings.plan:  # a plan that cannot be served is one line and exit 2, before anything listens
        from boute.errors import BouteError
        from boute.serving.bundle import open_plan
        from router.routing import RoutePolicy, endpoint_judge

        try:
            plan = open_plan(settings.plan)
            judge = endpoint_judge(
                plan.routing, settings.judge_url, settings.judge_model, settings.judge_timeout_s, settings.plan
            )
            RoutePolicy(plan, Path(settings.plan).parent, judge=judge, file=settings.plan)
        except BouteError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if settings.workers > 1:
        from router.workers import Supervisor

        command = [sys.executable, "-m", "router", *(sys.argv[1:] if argv is None else argv)]
        return Supervisor(command, settings.workers, settings.drain_timeout_s).run()
    # uvicorn drains, then re-raises the SIGINT it caught: a clean stop, not an error
    with contextlib.suppress(KeyboardInterrupt):
        serve(settings, args.host, args.port, args.log_level)
    return 0


def _worker(settings: Settings, host: str, port: int, log_level: str, worker_dir: Path) -> int:
    """One of the supervisor's workers: stops with it; a port it cannot bind is one line and exit 2."""
    from router.workers import die_with_parent, worker_socket

    die_with_parent()
    try:
        sock = worker_socket(host, port)  # before start-up: a taken port fails fast
    except OSError as exc:
        print(f"error: gateway worker cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        serve(settings, host, port, log_level, worker=(sock, worker_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
