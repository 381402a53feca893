"""A ``prometheus.yml`` for one deployment: its gateways and its metric-exporting replicas as scrape targets.

Laid out as a fleet operator runs Prometheus: the config names its targets through file-based service
discovery (``file_sd_configs``), so a rolling update or a re-plan rewrites only the target files and
Prometheus follows within seconds, with no reload. The rule files are copied beside the config, so the
folder is self-contained (move it to the Prometheus host as it is):

    prometheus.yml                  global intervals, the rule files, one job for gateways, one for replicas
    prometheus.d/boute-recording.yml, boute-alerts.yml
    prometheus.d/gateways.json, replicas.json      the targets, each labelled deployment=<name> (+ tier, replica)

Relative paths in the config resolve against its folder (Prometheus' rule). Pure but for :func:`write_config`
and :func:`write_targets`, which write files atomically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from boute.errors import BouteError
from boute.observability import DEPLOYMENT_LABEL, GATEWAY_JOB, REPLICA_JOB, RULE_FILES, rule_paths
from boute.specs.io import write_atomic

#: what Prometheus scrapes when told nothing else: 15 s (its own default is 1 min; the rules' 5-minute windows
#: then hold 20 samples, enough for rate() to follow a change within a window)
DEFAULT_INTERVAL_S = 15.0
#: how often Prometheus re-reads the target files where it cannot watch them (it watches them with inotify)
SD_REFRESH = "30s"
WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class Target:
    """One ``/metrics`` endpoint: a base URL (``http://host:port``) and its labels beyond the deployment."""

    url: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        """``host:port`` as Prometheus wants it; a wildcard bind (0.0.0.0) is scraped on loopback."""
        parts = urlsplit(self.url if "//" in self.url else f"http://{self.url}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if port is None or parts.hostname is None:
            raise BouteError(f"scrape target '{self.url}': expected http://HOST:PORT")
        host = "127.0.0.1" if parts.hostname in WILDCARDS else parts.hostname
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class ConfigFiles:
    """What :func:`write_config` wrote."""

    config: Path
    rules: list[Path]
    targets: dict[str, Path]  # job -> its file_sd file


def duration(seconds: float) -> str:
    """Prometheus' duration syntax: 15 -> '15s', 0.5 -> '500ms'."""
    if seconds <= 0:
        raise BouteError(f"scrape interval: must be positive, got {seconds:g}")
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def target_groups(deployment: str, targets: Sequence[Target]) -> list[dict[str, Any]]:
    """A file_sd document: one group per distinct label set, every target labelled with the deployment."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for t in targets:
        labels = {DEPLOYMENT_LABEL: deployment, **t.labels}
        groups.setdefault(tuple(sorted(labels.items())), []).append(t.address)
    return [{"targets": sorted(addrs), "labels": dict(key)} for key, addrs in groups.items()]


def prometheus_config(
    rule_files: Sequence[str],
    sd_files: Mapping[str, str],
    *,
    scrape_interval_s: float = DEFAULT_INTERVAL_S,
    evaluation_interval_s: float = DEFAULT_INTERVAL_S,
) -> dict[str, Any]:
    """The config document: global intervals (the scrape timeout no longer than the interval, as Prometheus
    requires), the rule files and one job per file_sd file (``job -> path``, relative to the config)."""
    interval = duration(scrape_interval_s)
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": duration(min(scrape_interval_s, 10.0)),
            "evaluation_interval": duration(evaluation_interval_s),
        },
        "rule_files": list(rule_files),
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": [path], "refresh_interval": SD_REFRESH}],
            }
            for job, path in sd_files.items()
        ],
    }


def _side_dir(config: Path) -> Path:
    return config.parent / f"{config.stem}.d"


def write_targets(
    config: Path, deployment: str, gateways: Sequence[Target], replicas: Sequence[Target]
) -> dict[str, Path]:
    """(Re)write the target files of the config at ``config``: what a rolling update calls; Prometheus
    follows without a reload."""
    side = _side_dir(config)
    side.mkdir(parents=True, exist_ok=True)
    out = {GATEWAY_JOB: side / "gateways.json", REPLICA_JOB: side / "replicas.json"}
    for job, targets in ((GATEWAY_JOB, gateways), (REPLICA_JOB, replicas)):
        write_atomic(out[job], json.dumps(target_groups(deployment, targets), indent=2) + "\n")
    return out


def write_config(
    config: Path,
    deployment: str,
    gateways: Sequence[Target],
    replicas: Sequence[Target] = (),
    *,
    scrape_interval_s: float = DEFAULT_INTERVAL_S,
    evaluation_interval_s: float = DEFAULT_INTERVAL_S,
) -> ConfigFiles:
    """Write ``config`` with its rule files and target files in ``<config stem>.d/`` beside it."""
    side = _side_dir(config)
    side.mkdir(parents=True, exist_ok=True)
    rules = [write_atomic(side / src.name, src.read_bytes()) for src in rule_paths()]
    sd = write_targets(config, deployment, gateways, replicas)
    doc = prometheus_config(
        [f"{side.name}/{name}" for name in RULE_FILES],
        {job: f"{side.name}/{p.name}" for job, p in sd.items()},
        scrape_interval_s=scrape_interval_s,
        evaluation_interval_s=evaluation_interval_s,
    )
    header = f"# Prometheus for the BOute deployment '{deployment}' (docs/observability.md)\n"
    write_atomic(config, header + yaml.safe_dump(doc, sort_keys=False))
    return ConfigFiles(config, rules, sd)
