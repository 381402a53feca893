"""``boute serve``: the gateway for a plan, optionally with emulated backends for every replica.

The plan is opened as a bundle (its router, scenario and files checked by hash); emulated replicas time
themselves with the plan's own catalog (scenario-defined hardware, calibration). SIGTERM (what a container
runtime or supervisor sends) stops the gateway and every replica, as Ctrl-C does. ``--workers N`` runs the gateway
as N processes on the port (router.workers), the emulated replicas still once.
"""

from __future__ import annotations

from pathlib import Path

import typer

from boute.cli.options import positive
from boute.cli.prometheus_config import PROMETHEUS_OPTION


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        plan: Path = typer.Option(..., "--plan", "-p", help="plan JSON/YAML to serve (with its .bundle folder)"),
        emulate: bool = typer.Option(False, "--emulate", help="start emulated CPU backends for the plan's replicas"),
        host: str = typer.Option("127.0.0.1", "--host"),
        port: int = typer.Option(8000, "--port", min=1, max=65535),
        redis: str | None = typer.Option(None, "--redis", help="Redis URL for shared state (several gateways)"),
        backends: Path | None = typer.Option(None, "--backends", help="backend registry JSON (without --emulate)"),
        speedup: float = typer.Option(
            1.0, "--speedup", callback=positive, help="emulated backends run this much faster than real time"
        ),
        prometheus_config: Path | None = PROMETHEUS_OPTION,
        workers: int = typer.Option(
            1,
            "--workers",
            min=1,
            help="gateway worker processes on the port, one core each (more than 1 needs --redis)",
        ),
        affinity: bool | None = typer.Option(
            None,
            "--affinity/--no-affinity",
            help="prefix-affinity (cache-aware) balancing within a tier, over the plan's 'affinity' section "
            "(default: as the plan says; a plan without one balances by least load)",
        ),
    ) -> None:
        """Start the gateway (and emulated backends); ready when /ready answers 200; Ctrl-C or SIGTERM stops all."""
        from boute.cli.stack import ServeStack
        from boute.errors import BouteError
        from boute.serving.bundle import open_plan
        from router.config import workers_problem

        p = open_plan(plan)
        if backends is None and not emulate and redis is None:
            raise BouteError("serve: give --emulate, --backends FILE or --redis URL (a registry there)")
        problem = workers_problem(workers, redis)
        if problem is not None:
            raise BouteError(f"serve: {problem}")
        with ServeStack(plan, p, host=host, port=port, redis=redis, backends=backends) as stack:
            try:
                if emulate:
                    n = stack.start_emulated(speedup)
                    typer.echo(f"started {n} emulated replicas (speedup {speedup:g}); registry {stack.backends}")
                stack.start_gateway(workers=workers, affinity=affinity)
                if prometheus_config is not None:
                    from boute.cli.prometheus_config import for_serve

                    typer.echo(for_serve(prometheus_config, plan, stack.url, stack.backends))
                on = f"; {workers} gateway workers" if workers > 1 else ""
                typer.echo(f"ready: {stack.url}/v1 (models: boute, router-<tier>{on}); Ctrl-C stops")
                stack.wait()
            except (RuntimeError, TimeoutError) as exc:
                raise BouteError(f"serve: {exc}") from None
