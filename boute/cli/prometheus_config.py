"""``--prometheus-config FILE`` of ``boute serve`` and ``boute deploy up``: Prometheus for what they run.

The gateways are always targets. A replica is one only where it exports metrics: each is asked for
``/metrics`` when the config is written (the emulated backend exports none; SGLang does when started with
``--enable-metrics``), so the config never lists a target that can only be down. The targets live in file_sd files beside the config (:mod:`boute.observability.scrape`): a
deployment's rolling updates (``boute deploy up`` again, ``boute replan``) rewrite them, and Prometheus
follows without a reload.

The ``deployment`` label: the plan file's name for ``boute serve``, the Redis prefix for ``boute deploy``
(it names the deployment among those sharing a Redis, and stays the same across re-plans).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:  # imported where used: `boute --help` stays fast
    from boute.observability.scrape import Target

PROMETHEUS_OPTION = typer.Option(
    None,
    "--prometheus-config",
    help="write a prometheus.yml for this deployment there (gateways and metric-exporting replicas as targets, "
    "BOute's recording and alert rules beside it; docs/observability.md)",
)
#: where a deployment remembers its config (in its config.json), so its rolling updates refresh the targets
CONFIG_KEY = "prometheus_config"


def exports_metrics(url: str, timeout_s: float = 2.0) -> bool:
    """Whether ``url/metrics`` answers 200 with Prometheus' text format."""
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and r.headers.get("content-type", "").startswith("text/plain")


def replica_targets(replicas: Iterable[tuple[str, Mapping[str, str]]]) -> tuple[list[Target], int]:
    """(the replicas that export metrics, how many were asked), from ``(url, labels)`` pairs."""
    from boute.observability.scrape import Target

    asked = list(replicas)
    return [Target(url, labels) for url, labels in asked if exports_metrics(url)], len(asked)


def _written(path: Path, deployment: str, gateways: list[Target], replicas: list[Target], asked: int) -> str:
    from boute.observability.scrape import write_config

    files = write_config(path, deployment, gateways, replicas)
    return (
        f"prometheus config: {files.config} (deployment '{deployment}': {len(gateways)} gateway(s), "
        f"{len(replicas)} of {asked} replica(s) export metrics); run: prometheus --config.file {files.config}"
    )


def for_serve(path: Path, plan_path: Path, gateway_url: str, backends: Path | None) -> str:
    """Write the config for ``boute serve``: its gateway and the registry's replicas; returns the line to print."""
    from boute.observability.scrape import Target
    from boute.serving import BACKENDS

    specs = BACKENDS.validate_json(backends.read_bytes()) if backends is not None else []
    replicas, asked = replica_targets((b.url, {"tier": b.tier, "replica": b.id}) for b in specs)
    return _written(path, plan_path.stem, [Target(gateway_url)], replicas, asked)


def _deployment_targets(state: Mapping[str, Any]) -> tuple[list[Target], list[Target], int]:
    from boute.observability.scrape import Target

    gateways = [Target(state["gateway_url"])] if state.get("gateway_url") else []
    pairs = [(r["url"], {"tier": r["tier"], "replica": r["id"]}) for r in state.get("replicas", [])]
    replicas, asked = replica_targets(pairs)
    return gateways, replicas, asked


def deployment_name(state: Mapping[str, Any]) -> str:
    return str(state["registry"]["prefix"])


def for_deployment(path: Path, directory: Path, state: Mapping[str, Any]) -> str:
    """Write the config for the deployment in ``directory`` and remember it there (its rolling updates
    refresh the targets); returns the line to print."""
    from backends.deploy.state import CONFIG_FILE
    from boute.specs.io import write_atomic

    gateways, replicas, asked = _deployment_targets(state)
    line = _written(path, deployment_name(state), gateways, replicas, asked)
    if not gateways:
        line += "\n  no gateway runs in this deployment (--gateway-port): add yours to the gateways.json beside it"
    cfg_file = directory / CONFIG_FILE
    cfg = json.loads(cfg_file.read_text())
    write_atomic(cfg_file, json.dumps({**cfg, CONFIG_KEY: str(path.resolve())}, indent=2))
    return line


def refresh_deployment(directory: Path, state: Mapping[str, Any]) -> None:
    """After a rolling update: rewrite the target files of the config the deployment remembers, if any."""
    from backends.deploy.state import CONFIG_FILE
    from boute.observability.scrape import write_targets

    cfg_file = directory / CONFIG_FILE
    cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    if cfg.get(CONFIG_KEY):
        gateways, replicas, _ = _deployment_targets(state)
        write_targets(Path(cfg[CONFIG_KEY]), deployment_name(state), gateways, replicas)
