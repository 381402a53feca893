"""``boute serve``: the gateway for a plan, optionally with emulated backends for every replica.

The plan is opened as a bundle (its router, scenario and files checked by hash); emulated replicas time
themselves with the plan's own catalog (scenario-defined hardware, calibration). SIGTERM (what a container
runtime or supervisor sends) stops the gateway and every replica, as Ctrl-C does.
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
    ) -> None:
        """Start the gateway (and emulated backends); ready when /ready answers 200; Ctrl-C or SIGTERM stops all."""
        from boute.cli.stack import ServeStack
        from boute.errors import BouteError
        from boute.serving.bundle import open_plan

        p = open_plan(plan)
        if backends is None and not emulate and redis is None:
            raise BouteError("serve: give --emulate, --backends FILE or --redis URL (a registry there)")
        with ServeStack(plan, p, host=host, port=port, redis=redis, backends=backends) as stack:
            try:
                if emulate:
                    n = stack.start_emulated(speedup)
                    typer.echo(f"started {n} emulated replicas (speedup {speedup:g}); registry {stack.backends}")
                stack.start_gateway()
                if prometheus_config is not None:
                    from boute.cli.prometheus_config import for_serve

                    typer.echo(for_serve(prometheus_config, plan, stack.url, stack.backends))
                typer.echo(f"ready: {stack.url}/v1 (models: boute, router-<tier>); Ctrl-C stops")
                stack.wait()
            except (RuntimeError, TimeoutError) as exc:
                raise BouteError(f"serve: {exc}") from None
