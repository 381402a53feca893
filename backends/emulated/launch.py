"""Start emulated replicas for a plan as child processes and describe them as a gateway backend registry.

Shared by ``boute serve --emulate``, the tests and the gateway bench, so all three run the same stack.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from backends.emulated.profile import ReplicaConfig
from boute.serving.bundle import scenario_profile
from boute.specs.plan import Plan
from boute.specs.scenario import Scenario


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replica_configs(
    plan: Plan, scenario: Scenario | None = None, speedup: float = 1.0, catalog: str | None = None
) -> list[ReplicaConfig]:
    """One config per replica of the plan, on free ports; answers from the scenario's profile columns, timing
    from ``catalog`` (a file written by :func:`boute.serving.bundle.write_catalog`; default: packaged). Each
    reports its prefix-cache hits in the OpenAI usage (SGLang's ``--enable-cache-report``): BOute reads them."""
    columns: dict[str, str] = {}
    profile = "builtin:gsm8k"
    if scenario is not None:
        profile = scenario_profile(scenario)
        for t in scenario.tiers:
            columns[t.name] = t.quality_model or t.name
    out = []
    for g in plan.deployment:
        for _ in range(g.count):
            out.append(
                ReplicaConfig(
                    model=g.model,
                    gpu=g.gpu,
                    tp=g.tp,
                    pp=g.pp,
                    dtype=g.dtype,
                    port=free_port(),
                    profile=profile if g.tier in columns else None,
                    profile_model=columns.get(g.tier),
                    speedup=speedup,
                    catalog=catalog,
                    enable_cache_report=True,
                )
            )
    return out


def registry(plan: Plan, configs: list[ReplicaConfig]) -> list[dict[str, object]]:
    """Backend registry entries (gateway ``BackendSpec`` JSON) for configs made by :func:`replica_configs`."""
    tiers = [g.tier for g in plan.deployment for _ in range(g.count)]
    return [
        {
            "url": f"http://{c.host}:{c.port}",
            "tier": tier,
            "model": c.name,
            "gpu": c.gpu,
            "tp": c.tp,
            "pp": c.pp,
            "dtype": c.dtype,
            "name": f"{tier}-{c.gpu}-{c.port}",
        }
        for tier, c in zip(tiers, configs, strict=True)
    ]


def spawn_replicas(
    configs: list[ReplicaConfig], workdir: Path, one_process: bool = True, env: dict[str, str] | None = None
) -> list[subprocess.Popen[bytes]]:
    """Start the replicas (all in one process, or one process each; ``env``: extra environment, e.g. the
    replicas' token); returns the child processes."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    groups = [configs] if one_process else [[c] for c in configs]
    procs = []
    for i, group in enumerate(groups):
        f = workdir / f"replicas-{i}.json"
        f.write_text(json.dumps([c.model_dump() for c in group]))
        cmd = [sys.executable, "-m", "backends.emulated", "--replicas", str(f)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def wait_http(url: str, timeout: float = 60.0, procs: list[subprocess.Popen[bytes]] | None = None) -> None:
    """Poll ``url`` until it answers 200; raise if a watched child exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        for p in procs or []:
            if p.poll() is not None:
                raise RuntimeError(f"process {p.args} exited with {p.returncode} before {url} answered")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer 200 within {timeout:.0f}s")
        time.sleep(0.1)
