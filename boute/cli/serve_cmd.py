"""``boute serve``: the gateway for a plan, optionally with emulated backends for every replica."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        plan: Path = typer.Option(..., "--plan", "-p", help="plan JSON/YAML to serve"),
        emulate: bool = typer.Option(False, "--emulate", help="start emulated CPU backends for the plan's replicas"),
        host: str = typer.Option("127.0.0.1", "--host"),
        port: int = typer.Option(8000, "--port"),
        redis: str | None = typer.Option(None, "--redis", help="Redis URL for shared state (several gateways)"),
        backends: Path | None = typer.Option(None, "--backends", help="backend registry JSON (without --emulate)"),
        scenario: str | None = typer.Option(None, "--scenario", "-s", help="scenario for profile answers (emulate)"),
        speedup: float = typer.Option(1.0, "--speedup", help="emulated backends run this much faster than real time"),
    ) -> None:
        """Start the gateway (and emulated backends); ready when /ready answers 200; Ctrl-C stops all."""
        import json
        import os
        import signal
        import subprocess
        import sys
        import tempfile

        from backends.emulated.launch import registry, replica_configs, spawn_replicas, wait_http
        from boute.errors import BouteError
        from boute.specs import load_plan, load_scenario

        p = load_plan(plan)
        if backends is None and not emulate and redis is None:
            raise BouteError("serve: give --emulate, --backends FILE or --redis URL (a registry there)")
        work = Path(tempfile.mkdtemp(prefix="boute-serve-"))
        children: list[subprocess.Popen[bytes]] = []
        try:
            if emulate:
                sc = load_scenario(scenario or p.scenario) if (scenario or p.scenario) else load_scenario(None)
                if not set(p.routing.tiers) <= {t.name for t in sc.tiers}:
                    sc = None  # tiers unknown to the scenario: filler answers only
                configs = replica_configs(p, sc, speedup)
                children += spawn_replicas(configs, work)
                backends = work / "backends.json"
                backends.write_text(json.dumps(registry(p, configs), indent=2))
                for c in configs:
                    wait_http(f"http://{c.host}:{c.port}/health", 60, children)
                typer.echo(f"started {len(configs)} emulated replicas (speedup {speedup:g}); registry {backends}")
            cmd = [sys.executable, "-m", "router", "--plan", str(plan), "--host", host, "--port", str(port)]
            if backends is not None:
                cmd += ["--backends", str(backends)]
            if redis:
                cmd += ["--redis", redis]
            gw = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            children.append(gw)
            wait_http(f"http://{host}:{port}/ready", 120, children)
            typer.echo(f"ready: http://{host}:{port}/v1 (models: boute, router-<tier>); Ctrl-C stops")
            gw.wait()
        except KeyboardInterrupt:
            typer.echo("stopping ...")
        except (RuntimeError, TimeoutError) as exc:
            raise BouteError(f"serve: {exc}") from None
        finally:
            for c in reversed(children):
                if c.poll() is None:
                    c.send_signal(signal.SIGINT)
            for c in reversed(children):
                try:
                    c.wait(timeout=35)
                except subprocess.TimeoutExpired:
                    c.kill()
