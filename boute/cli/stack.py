"""A plan served here: emulated replicas (optional) and the gateway, as child processes, stopped together.

Used by ``boute serve`` and ``boute verify``. SIGTERM is turned into the same orderly stop as Ctrl-C:
every child gets SIGINT (the gateway drains, replicas exit), then SIGKILL after a grace period; a child
left behind would keep its port and its replicas' memory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from boute.cli.signals import Terminated, stop_signals
from boute.serving.bundle import plan_scenario, write_catalog
from boute.specs.plan import Plan


class ServeStack:
    def __init__(
        self,
        plan_path: Path,
        plan: Plan,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        redis: str | None = None,
        backends: Path | None = None,
        env: dict[str, str] | None = None,
        quiet: bool = False,
        stop_ends_command: bool = True,
    ) -> None:
        """``stop_ends_command``: Ctrl-C/SIGTERM is how ``boute serve`` ends normally (swallowed, exit 0);
        a command that serves only to do something else (``boute verify``) lets it propagate instead."""
        self.plan_path, self.plan = Path(plan_path), plan
        self.host, self.port, self.redis, self.backends = host, port, redis, backends
        self.env = env or {}
        self.quiet, self.stop_ends_command = quiet, stop_ends_command
        self.work = Path(tempfile.mkdtemp(prefix="boute-serve-"))
        self.children: list[subprocess.Popen[bytes]] = []
        self._signals = stop_signals()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServeStack:
        self._signals.__enter__()  # Ctrl-C and SIGTERM unwind, even where SIGINT was inherited ignored
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> bool:
        # a second Ctrl-C or SIGTERM (impatient users, supervisors that repeat) must not cut the shutdown
        # short and orphan the children: ignore both until every child is stopped
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            self.stop()
        finally:
            self._signals.__exit__(None, None, None)  # the handlers the command had before
        # Ctrl-C or SIGTERM is how a user stops the server: not an error
        return self.stop_ends_command and exc_type in (KeyboardInterrupt, Terminated)

    def start_emulated(self, speedup: float) -> int:
        """One emulated process serving every replica of the plan; returns the replica count."""
        from backends.emulated.launch import registry, replica_configs, spawn_replicas, wait_http

        sc = plan_scenario(self.plan, self.plan_path)
        catalog = write_catalog(self.plan, sc, self.work / "catalog.yaml")
        configs = replica_configs(self.plan, sc, speedup, catalog=str(catalog))
        self.children += spawn_replicas(configs, self.work)
        self.backends = self.work / "backends.json"
        self.backends.write_text(json.dumps(registry(self.plan, configs), indent=2))
        for c in configs:
            wait_http(f"http://{c.host}:{c.port}/health", 60, self.children)
        return len(configs)

    def start_gateway(self, ready_timeout_s: float = 120.0, workers: int = 1, affinity: bool | None = None) -> None:
        """The gateway: one process, or a supervisor and ``workers`` worker processes on the port (ready when
        the first listens; router.workers). ``affinity``: prefix-affinity balancing on/off (None: the plan's)."""
        from backends.emulated.launch import wait_http

        cmd = [sys.executable, "-m", "router", "--plan", str(self.plan_path), "--host", self.host]
        cmd += ["--port", str(self.port), "--workers", str(workers)]
        if self.backends is not None:
            cmd += ["--backends", str(self.backends)]
        if self.redis:
            cmd += ["--redis", self.redis]
        if affinity is not None:
            cmd.append("--affinity" if affinity else "--no-affinity")
        out = subprocess.DEVNULL if self.quiet else None
        gw = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env}, stdout=out, stderr=out)
        self.children.append(gw)
        wait_http(f"{self.url}/ready", ready_timeout_s, self.children)

    def wait(self) -> None:
        """Until the gateway exits (or Ctrl-C / SIGTERM unwinds this)."""
        self.children[-1].wait()

    def stop(self, grace_s: float = 35.0) -> None:
        for c in reversed(self.children):
            if c.poll() is None:
                c.send_signal(signal.SIGINT)
        for c in reversed(self.children):
            try:
                c.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
        self.children.clear()
