"""Test and bench support: emulated replicas and gateways as real processes on free local ports.

Everything runs as separate processes speaking real HTTP, as in production; only the ports are local.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.emulated.launch import free_port, registry, replica_configs, spawn_replicas, wait_http
from backends.emulated.profile import ReplicaConfig
from boute.specs.plan import Plan
from tests.waits import SAFETY_S

#: a small two-tier plan on three GPU types (used by tests and the bench)
TEST_PLAN: dict[str, Any] = {
    "scenario": "builtin:paper-gsm8k",
    "routing": {
        "mode": "preroute",
        "tiers": ["small", "large"],
        "fractions": [0.5, 0.5],
        "scorer": "length",
        "reference": "builtin:gsm8k",
    },
    "deployment": [
        {"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 1},
        {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090", "count": 1},
        {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4},
    ],
}


@contextmanager
def serving_replicas(configs: Sequence[ReplicaConfig], work: Path) -> Iterator[str]:
    """Emulated replicas for ``configs`` as processes, up and answering ``/health``; yields the first one's
    URL and stops them all after."""
    procs = spawn_replicas(list(configs), work)
    try:
        wait_http(f"http://127.0.0.1:{configs[0].port}/health", 60, procs)
        yield f"http://127.0.0.1:{configs[0].port}"
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


@dataclass
class Stack:
    """Emulated replicas (one process each, so one can be killed) + any number of gateways."""

    plan: Plan
    workdir: Path
    speedup: float = 20.0
    replicas: list[subprocess.Popen[bytes]] = field(default_factory=list)
    backend_urls: list[str] = field(default_factory=list)
    gateways: list[subprocess.Popen[bytes]] = field(default_factory=list)
    plan_file: Path | None = None
    backends_file: Path | None = None

    @classmethod
    def start(
        cls,
        plan: dict[str, Any] | None = None,
        speedup: float = 20.0,
        one_process: bool = False,
        env: dict[str, str] | None = None,
    ) -> Stack:
        """``env``: extra environment for the replica processes (e.g. BOUTE_REPLICA_TOKEN)."""
        from boute.specs import load_scenario

        p = Plan.model_validate(plan or TEST_PLAN)
        work = Path(tempfile.mkdtemp(prefix="boute-stack-"))
        configs = replica_configs(p, load_scenario(None), speedup)
        st = cls(p, work, speedup)
        st.replicas = spawn_replicas(configs, work, one_process=one_process, env=env)
        st.backend_urls = [f"http://{c.host}:{c.port}" for c in configs]
        st.plan_file = work / "plan.json"
        st.plan_file.write_text(p.model_dump_json(exclude_none=True))
        st.backends_file = work / "backends.json"
        st.backends_file.write_text(json.dumps(registry(p, configs)))
        for u in st.backend_urls:
            wait_http(u + "/health", SAFETY_S, st.replicas)
        return st

    def gateway(self, wait_ready: bool = True, **env: str) -> tuple[str, subprocess.Popen[bytes]]:
        """Start a gateway process; ``env`` are BOUTE_* overrides (e.g. BOUTE_REDIS_URL)."""
        port = free_port()
        full_env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "BOUTE_PLAN": str(self.plan_file),
            "BOUTE_BACKENDS": str(self.backends_file),
            "BOUTE_HEALTH_INTERVAL_S": "0.5",
            "BOUTE_COOLDOWN_S": "2",
            **env,
        }
        log = open(self.workdir / f"gateway-{port}.log", "wb")  # noqa: SIM115 - lives as long as the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "router", "--port", str(port), "--log-level", "info"],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.gateways.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + ("/ready" if wait_ready else "/health"), SAFETY_S, [proc])
        return url, proc

    def kill_replica(self, index: int) -> None:
        self.replicas[index].kill()
        self.replicas[index].wait(timeout=10)

    def stop(self) -> None:
        for p in [*self.gateways, *self.replicas]:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in [*self.gateways, *self.replicas]:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
