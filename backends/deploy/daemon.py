"""``python -m backends.deploy.daemon --dir DIR``: the background controller behind ``boute deploy``.

Reads ``DIR/config.json`` (target, registry, launch options) and ``DIR/desired.json`` (the plan), deploys,
then watches the fleet; SIGHUP re-reads ``desired.json`` and rolls to it; SIGTERM/SIGINT deregisters and
stops everything. Progress and failures go to ``DIR/state.json`` (atomically), where the CLI reads them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from backends.deploy.controller import Controller
from backends.deploy.launch import LaunchOptions, default_replica_host, is_loopback
from backends.deploy.registry import Registry
from backends.deploy.state import CONFIG_FILE, DESIRED_FILE
from backends.deploy.target import Target
from boute.serving.auth import replica_token
from boute.specs.plan import Plan

log = logging.getLogger("boute.deploy")


def make_target(cfg: dict[str, Any], opts: LaunchOptions, log_dir: Path) -> Target:
    if cfg["target"] == "local":
        from backends.deploy.local import LocalTarget

        gpu_ids = {g: [int(i) for i in ids] for g, ids in (cfg.get("gpu_ids") or {}).items()}
        return LocalTarget(log_dir, opts, gpu_ids=gpu_ids)
    import ray

    from backends.deploy.ray_local import init_local_cluster
    from backends.deploy.ray_target import RayTarget, resource_name

    if cfg.get("ray_address"):
        ray.init(address=cfg["ray_address"], namespace="boute", log_to_driver=False)
    else:  # a one-node cluster whose custom resources stand in for the scenario's GPU inventory
        resources = {resource_name(g): float(n) for g, n in (cfg.get("inventory") or {}).items()}
        init_local_cluster(resources, loopback=is_loopback(opts.host))  # loopback replicas: Ray stays there too
    return RayTarget(log_dir, opts, mode=cfg.get("resource_mode", "custom"))


def run(directory: Path) -> int:
    cfg = json.loads((directory / CONFIG_FILE).read_text())
    opts = LaunchOptions(
        emulate=bool(cfg.get("emulate", True)),
        speedup=float(cfg.get("speedup", 1.0)),
        profile=cfg.get("profile", "builtin:gsm8k"),
        profile_models=cfg.get("profile_models") or {},
        model_paths=cfg.get("model_paths") or {},
        default_model_path=cfg.get("default_model_path"),
        sglang_cpu=bool(cfg.get("sglang_cpu", False)),
        max_total_tokens=cfg.get("max_total_tokens"),
        python=cfg.get("python") or sys.executable,
        catalog=cfg.get("catalog"),
        host=cfg.get("replica_host")
        or default_replica_host(
            emulate=bool(cfg.get("emulate", True)), target=cfg["target"], ray_address=cfg.get("ray_address")
        ),
        token=replica_token(),  # handed to each replica; the gateway started below inherits it from this process
    )
    logs = directory / "logs"
    registry = Registry(cfg["redis_url"], cfg.get("prefix", "boute"))
    # the scenario's inventory bounds what a rolling update may hold at once (make vs break before make)
    inventory = {g: int(n) for g, n in (cfg.get("inventory") or {}).items()} or None
    ctl = Controller(
        make_target(cfg, opts, logs),
        registry,
        opts,
        directory,
        ready_timeout_s=float(cfg.get("ready_timeout_s", 300)),
        capacity=inventory,
    )
    ctl.extra = {"pid": os.getpid(), "dir": str(directory)}
    reload, stop = threading.Event(), threading.Event()
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    gateway = None
    reload.set()
    try:
        while not stop.is_set():
            if reload.is_set():
                reload.clear()
                plan = Plan.model_validate_json((directory / DESIRED_FILE).read_text())
                try:
                    ctl.apply(plan)
                except Exception as exc:  # state.json already says failed + why; keep serving what runs
                    log.error("rollout failed: %s", exc)
                if gateway is None and cfg.get("gateway_port") and ctl.status == "ready":
                    from backends.deploy.gateway import start_gateway

                    url, gateway = start_gateway(registry.url, registry.prefix, logs, port=int(cfg["gateway_port"]))
                    ctl.extra["gateway_url"] = url
                    ctl.save()
            ctl.check()
            stop.wait(float(cfg.get("health_interval_s", 1.0)))
    finally:
        if gateway is not None:
            gateway.stop(5.0)
        ctl.down()
        registry.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backends.deploy.daemon")
    ap.add_argument("--dir", type=Path, required=True)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return run(a.dir)


if __name__ == "__main__":
    sys.exit(main())
