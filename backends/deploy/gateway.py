"""A gateway process that follows a deployment's Redis registry (``python -m router --redis``), supervised.

The deployer starts one when asked (``boute deploy --gateway-port``, the live evaluator) so a fleet is
reachable as one OpenAI endpoint; the gateway learns replicas and the plan only from Redis.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from backends.deploy.launch import free_port
from backends.supervisor import ProcessSpec, RestartPolicy, SupervisedProcess


def start_gateway(
    redis_url: str,
    prefix: str,
    log_dir: str | Path,
    port: int | None = None,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 60.0,
) -> tuple[str, SupervisedProcess]:
    """Start and wait for ``/health`` (``/ready`` needs a plan and replicas, which may come later)."""
    port = port or free_port(host)
    argv = (
        sys.executable,
        "-m",
        "router",
        "--redis",
        redis_url,
        "--redis-prefix",
        prefix,
        "--host",
        host,
        "--port",
        str(port),
    )
    full_env = {"PYTHONUNBUFFERED": "1", "BOUTE_HEALTH_INTERVAL_S": "0.5", "BOUTE_COOLDOWN_S": "2", **(env or {})}
    spec = ProcessSpec(name=f"gateway-{port}", argv=argv, env=full_env, health_url=f"http://{host}:{port}/health")
    proc = SupervisedProcess(spec, log_dir, RestartPolicy(backoff_initial_s=0.2, backoff_max_s=5.0)).start()
    proc.wait_ready(ready_timeout_s)
    return f"http://{host}:{port}", proc
