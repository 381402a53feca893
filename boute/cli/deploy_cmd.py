"""``boute deploy up PLAN --target local|ray [--emulate | --sglang-cpu]``, ``boute deploy status|down``.

A deployment is a background controller (``backends.deploy.daemon``) owning the replicas; this command
only hands it a plan and waits. Deploying while one runs is a rolling update to the new plan (on the engine
the deployment was started with).

``--sglang-cpu`` (local target): real ``sglang.launch_server`` replicas on this CPU, from the ``make sglang``
install (its python and SmolLM2 serve every tier, with :func:`backends.sglang.cpu.cpu_options`' flags);
without that install, one line says to run it.

Where replicas listen is said, not implied: ``--replica-host`` (default: loopback for emulated fleets and the
local target, the node's address for Ray fleets of real engines), printed with the fleet; beyond loopback
without ``BOUTE_REPLICA_TOKEN`` the command warns that anyone who reaches them can use them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from boute.cli.options import DEPLOY_DIR, deployment_dir, positive
from boute.cli.prometheus_config import PROMETHEUS_OPTION
from boute.errors import BouteError
from boute.serving.registry import DEFAULT_REDIS_URL


def _parse_gpu_ids(items: list[str]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for it in items:
        name, sep, ids = it.partition("=")
        try:
            out[name] = [int(i) for i in ids.split(",") if i != ""]
        except ValueError:
            sep = ""
        if not sep or not name:
            raise BouteError(f"--gpu-ids: expected TYPE=0,1,..., got '{it}'")
    return out


def _wait(
    directory: Path, generation: int, timeout_s: float, proc: Any = None, gateway: bool = False
) -> dict[str, Any]:
    from backends.deploy.state import DAEMON_LOG, pid_alive, read_state
    from backends.supervisor import log_tail

    deadline = time.monotonic() + timeout_s
    while True:
        st = read_state(directory) or {}
        ready = st.get("status") == "ready" and int(st.get("generation", 0)) > generation
        if ready and (st.get("gateway_url") or not gateway):
            return st
        if st.get("status") == "failed" and st.get("error"):
            raise BouteError(f"deploy: {st['error']}")
        gone = proc is not None and proc.poll() is not None
        if gone or st.get("pid") and not pid_alive(st["pid"]) or st.get("status") == "stopped":
            raise BouteError(f"deploy: controller exited ({log_tail(directory / DAEMON_LOG) or 'no log'})")
        if time.monotonic() > deadline:
            raise BouteError(f"deploy: not ready after {timeout_s:g}s (see {directory / 'state.json'})")
        time.sleep(0.3)


def _table(st: dict[str, Any]) -> str:
    lines = [
        f"status {st.get('status')}  target {st.get('target')}  generation {st.get('generation')}  "
        f"registry {st['registry']['redis_url']} prefix {st['registry']['prefix']}",
        f"replicas listen on {st.get('replica_host', '?')}, {'token required' if st.get('token') else 'no token'}",
    ]
    if st.get("gateway_url"):
        lines.append(f"gateway {st['gateway_url']}/v1")
    for r in st.get("replicas", []):
        where = r.get("node_ip") or r.get("node", "")
        res = r.get("resources") or r.get("gpu_ids") or ""
        lines.append(
            f"  {r['id']:<48} {r['url']:<26} {'registered' if r['registered'] else 'NOT registered':<14} "
            f"restarts {r.get('restarts', 0)}  {where} {res}"
        )
    return "\n".join(lines)


_JSON = typer.Option(False, "--json", help="print one JSON object")


@dataclass(frozen=True)
class DeployOptions:
    """What ``boute deploy up`` was asked for, beside the plan and the folder (the options of the same names)."""

    target: str
    emulate: bool
    redis: str
    prefix: str
    speedup: float
    gateway_port: int | None
    ray_address: str | None
    resource_mode: str
    gpu_ids: dict[str, list[int]]
    replica_host: str | None
    timeout: float
    sglang_cpu: bool = False
    max_total_tokens: int | None = None

    def check(self) -> None:
        """A one-line BouteError for a value or a combination the deployers do not take."""
        if self.target not in ("local", "ray"):
            raise BouteError(f"--target: expected local or ray, got '{self.target}'")
        if self.resource_mode not in ("custom", "accelerator"):
            raise BouteError(f"--resources: expected custom or accelerator, got '{self.resource_mode}'")
        if self.sglang_cpu and (self.emulate or self.target != "local"):
            raise BouteError("--sglang-cpu: runs real SGLang replicas with --target local, without --emulate")
        if self.max_total_tokens is not None and not self.sglang_cpu:
            raise BouteError("--max-total-tokens: only with --sglang-cpu")


def up_cmd(
    plan: Path = typer.Argument(..., help="plan JSON/YAML to deploy (with its .bundle folder)"),
    target: str = typer.Option("local", "--target", "-t", help="local (processes here) or ray (Ray actors)"),
    emulate: bool = typer.Option(False, "--emulate", help="emulated CPU backends instead of SGLang"),
    sglang_cpu: bool = typer.Option(
        False,
        "--sglang-cpu",
        help="local: real SGLang on this CPU (the `make sglang` install and its SmolLM2 for every tier); "
        "each replica is one CPU process (the plan's GPU type and tp/pp only name it)",
    ),
    max_total_tokens: int | None = typer.Option(
        None, "--max-total-tokens", min=256, help="--sglang-cpu: KV pool of each replica, tokens (16384)"
    ),
    redis: str = typer.Option(
        DEFAULT_REDIS_URL,
        "--redis",
        envvar="BOUTE_REDIS_URL",
        help="Redis the gateway reads its registry from",
    ),
    prefix: str = typer.Option("boute", "--prefix", help="Redis key prefix (the gateway's --redis-prefix)"),
    directory: Path | None = DEPLOY_DIR,
    speedup: float = typer.Option(
        1.0, "--speedup", callback=positive, help="emulated backends run this much faster than modelled"
    ),
    gateway_port: int | None = typer.Option(
        None, "--gateway-port", min=1, max=65535, help="also run a gateway on this port"
    ),
    ray_address: str | None = typer.Option(None, "--ray-address", help="existing Ray cluster (default: a local one)"),
    resource_mode: str = typer.Option(
        "custom", "--resources", help="ray: custom (gpu_<type> resources) or accelerator (num_gpus + type)"
    ),
    gpu_ids: list[str] = typer.Option([], "--gpu-ids", help="local SGLang: TYPE=0,1,.. CUDA ids per GPU type"),
    replica_host: str | None = typer.Option(
        None,
        "--replica-host",
        help="where replicas listen: an IP address, 0.0.0.0 (every interface) or 'node' (the address of the "
        "node each runs on); default 127.0.0.1 for --emulate and --target local, 'node' for Ray fleets. "
        "Set BOUTE_REPLICA_TOKEN to make replicas require a bearer token (the gateway sends it)",
    ),
    timeout: float = typer.Option(
        600.0, "--timeout", callback=positive, help="seconds to wait for the fleet to be ready"
    ),
    prometheus_config: Path | None = PROMETHEUS_OPTION,
    as_json: bool = _JSON,
) -> None:
    """Deploy a plan; while one runs, a rolling update to it."""
    from backends.deploy.state import read_state, running

    d = deployment_dir(directory)
    opts = DeployOptions(
        target=target,
        emulate=emulate,
        sglang_cpu=sglang_cpu,
        max_total_tokens=max_total_tokens,
        redis=redis,
        prefix=prefix,
        speedup=speedup,
        gateway_port=gateway_port,
        ray_address=ray_address,
        resource_mode=resource_mode,
        gpu_ids=_parse_gpu_ids(gpu_ids),
        replica_host=replica_host,
        timeout=timeout,
    )
    _deploy(plan, d, opts, as_json=as_json, running=running(read_state(d)), prometheus=prometheus_config)


def status_cmd(directory: Path | None = DEPLOY_DIR, as_json: bool = _JSON) -> None:
    """The deployment's state: replicas, registration, restarts, gateway."""
    from backends.deploy.state import read_state, running

    d = deployment_dir(directory)
    st = read_state(d)
    if st is None:
        raise BouteError(f"deploy status: nothing deployed in {d}")
    if not running(st) and st.get("status") != "stopped":
        st["status"] = "dead (controller not running)"
    typer.echo(json.dumps(st, indent=2) if as_json else _table(st))


def down_cmd(directory: Path | None = DEPLOY_DIR, as_json: bool = _JSON) -> None:
    """Stop the controller: replicas are drained, deregistered and stopped."""
    _down(deployment_dir(directory), as_json)


def register(app: typer.Typer) -> None:
    deploy = typer.Typer(help="Deploy a plan's replicas (rolling updates), show the fleet, take it down.")
    app.add_typer(deploy, name="deploy")
    deploy.command("up")(up_cmd)
    deploy.command("status")(status_cmd)
    deploy.command("down")(down_cmd)


def _down(d: Path, as_json: bool = False) -> None:
    import os
    import signal

    from backends.deploy.state import pid_alive, read_state

    st = read_state(d)
    if st is None or not pid_alive(st.get("pid")):
        typer.echo(json.dumps({"stopped": 0, "dir": str(d)}) if as_json else f"nothing running in {d}")
        return
    os.kill(int(st["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + 120
    while pid_alive(st["pid"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    if pid_alive(st["pid"]):
        raise BouteError(f"deploy down: controller {st['pid']} still running after 120s")
    n, pfx = len(st.get("replicas", [])), st["registry"]["prefix"]
    typer.echo(
        json.dumps({"stopped": n, "prefix": pfx, "dir": str(d)})
        if as_json
        else f"stopped {n} replicas; deregistered from prefix {pfx}"
    )


def _deploy(
    plan_path: Path, d: Path, opts: DeployOptions, *, as_json: bool, running: bool, prometheus: Path | None = None
) -> None:
    """``deploy up``: a rolling update where a deployment runs in ``d``, else a new controller started there;
    with ``prometheus``, a Prometheus config for it written there (its line on stderr under ``--json``)."""
    opts.check()
    if running:
        if opts.replica_host is not None:
            raise BouteError("--replica-host: a running deployment keeps its interface; `boute deploy down` it first")
        st = roll_out(plan_path, d, target=opts.target, timeout=opts.timeout)
    else:
        st = _start(plan_path, d, opts)
    typer.echo(json.dumps(st, indent=2) if as_json else _table(st))
    if prometheus is not None:
        from boute.cli.prometheus_config import for_deployment

        typer.echo(for_deployment(prometheus, d, st), err=as_json)


def _replica_host(opts: DeployOptions) -> str:
    """Where the replicas listen (``--replica-host`` or the target's default), with a warning on stderr when
    that is beyond loopback and no replica token is set."""
    from backends.deploy.launch import check_replica_host, default_replica_host, is_loopback
    from boute.serving.auth import TOKEN_ENV, replica_token

    host = check_replica_host(
        opts.replica_host
        or default_replica_host(emulate=opts.emulate, target=opts.target, ray_address=opts.ray_address)
    )
    if not is_loopback(host) and replica_token() is None:
        typer.echo(
            f"warning: replicas listen on {host} without {TOKEN_ENV}: anyone who reaches that address can "
            "use them (set it to require a bearer token; the gateway sends it)",
            err=True,
        )
    return host


def _engine_config(opts: DeployOptions) -> dict[str, Any]:
    """The controller's engine settings: real SGLang on this CPU for ``--sglang-cpu`` (one line, before anything
    starts, where `make sglang` was not run or failed), else none."""
    if not opts.sglang_cpu:
        return {}
    from backends.sglang.cpu import server_install

    inst = server_install()
    return {
        "sglang_cpu": True,
        "python": str(inst["python"]),
        "default_model_path": str(inst["model"]),
        "max_total_tokens": opts.max_total_tokens,
    }


def _start(plan_path: Path, d: Path, opts: DeployOptions) -> dict[str, Any]:
    """Start a controller on the plan in ``d`` (its config, catalog and desired plan written first) and wait
    for the fleet; returns the controller's state."""
    import subprocess
    import sys

    from backends.deploy.registry import Registry
    from backends.deploy.state import CONFIG_FILE, DAEMON_LOG, DESIRED_FILE
    from boute.serving.bundle import copy_plan, open_plan, plan_scenario, scenario_profile, write_catalog
    from boute.specs import load_scenario
    from boute.specs.io import write_atomic

    host = _replica_host(opts)
    engine = _engine_config(opts)
    p = open_plan(plan_path)
    sc = plan_scenario(p, plan_path) or load_scenario(p.scenario)
    d.mkdir(parents=True, exist_ok=True)
    try:  # fail fast with one line when the registry is unreachable
        Registry(opts.redis, opts.prefix).entries()
    except BouteError as exc:
        raise BouteError(f"--redis: {exc}") from None
    cfg = {
        "target": opts.target,
        "emulate": opts.emulate,
        "redis_url": opts.redis,
        "prefix": opts.prefix,
        "speedup": opts.speedup,
        "profile": scenario_profile(sc),
        "catalog": str(d / "catalog.yaml"),
        "profile_models": {t.name: t.quality_model or t.name for t in sc.tiers},
        "gateway_port": opts.gateway_port,
        "ray_address": opts.ray_address,
        "resource_mode": opts.resource_mode,
        "gpu_ids": opts.gpu_ids,
        "replica_host": host,
        "inventory": dict(sc.cluster.gpus),
        **engine,
    }
    write_atomic(d / CONFIG_FILE, json.dumps(cfg, indent=2))
    write_catalog(p, sc, d / "catalog.yaml")
    copy_plan(plan_path, p, d / DESIRED_FILE)
    (d / "state.json").unlink(missing_ok=True)
    with open(d / DAEMON_LOG, "ab") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "backends.deploy.daemon", "--dir", str(d)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return _wait(d, 0, opts.timeout, proc, gateway=opts.gateway_port is not None)


def roll_out(plan_path: Path, d: Path, *, target: str | None = None, timeout: float = 600.0) -> dict[str, Any]:
    """A rolling update of the deployment running in ``d`` to the plan at ``plan_path`` (``boute deploy up``
    while one runs, and the re-plan loop's rollout): the plan and its bundle files copied where the controller
    reads them, the controller told (SIGHUP), the new generation waited for. Returns the controller's state;
    a one-line BouteError when nothing runs there, it runs on another target, or the fleet is not ready in
    ``timeout`` seconds (the controller keeps converging on the new plan)."""
    import os
    import signal

    from backends.deploy.state import DESIRED_FILE, read_state, running
    from boute.serving.bundle import copy_plan, open_plan, plan_scenario, write_catalog
    from boute.specs import load_scenario

    p = open_plan(plan_path)
    sc = plan_scenario(p, plan_path) or load_scenario(p.scenario)
    st = read_state(d) or {}
    if not running(st):
        raise BouteError(f"deploy: nothing runs in {d}; `boute deploy up` a plan there first")
    if target is not None and st.get("target") != target:
        raise BouteError(f"deploy: a '{st.get('target')}' deployment runs in {d}; `boute deploy down` it first")
    copy_plan(plan_path, p, d / DESIRED_FILE)  # the plan and its bundle files, where the controller reads
    write_catalog(p, sc, d / "catalog.yaml")
    os.kill(int(st["pid"]), signal.SIGHUP)
    done = _wait(d, int(st.get("generation", 0)), timeout)
    from boute.cli.prometheus_config import refresh_deployment

    refresh_deployment(d, done)  # the replicas moved: Prometheus' target files follow
    return done
