"""``--prometheus-config``: the prometheus.yml written for a deployment, its targets and its rule files.

``promtool check config`` (where installed) judges the config as Prometheus does; the targets are checked
here (promtool 2.42 does not read file_sd files); tests/test_prometheus_live.py runs Prometheus on it."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.emulated.launch import free_port, wait_http
from boute.errors import BouteError
from boute.observability import GATEWAY_JOB, REPLICA_JOB, RULE_FILES
from boute.observability.scrape import Target, duration, write_config
from tests.stack import TEST_PLAN

PROMTOOL = shutil.which("promtool")


def _check_config(path: Path) -> None:
    if PROMTOOL is None:
        return  # the file checks below still run; promtool's is skipped where it is absent
    out = subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == 2 + len(RULE_FILES), out.stdout


def _targets(path: Path) -> dict[str, list[dict[str, Any]]]:
    """job -> its target groups, read the way Prometheus does: file_sd paths relative to the config."""
    doc = yaml.safe_load(path.read_text())
    return {
        job["job_name"]: json.loads((path.parent / job["file_sd_configs"][0]["files"][0]).read_text())
        for job in doc["scrape_configs"]
    }


def test_written_config_names_its_targets_and_rules(tmp_path: Path) -> None:
    cfg = tmp_path / "prom" / "prometheus.yml"
    replicas = [Target("http://127.0.0.1:30001", {"tier": "small", "replica": "s0"})]
    files = write_config(cfg, "prod", [Target("http://0.0.0.0:8000"), Target("http://10.0.0.2:8001")], replicas)
    _check_config(cfg)
    doc = yaml.safe_load(cfg.read_text())
    assert doc["global"] == {"scrape_interval": "15s", "scrape_timeout": "10s", "evaluation_interval": "15s"}
    assert [(cfg.parent / r).read_text() for r in doc["rule_files"]] == [p.read_text() for p in files.rules]
    groups = _targets(cfg)
    # a gateway bound to every interface is scraped on loopback
    assert groups[GATEWAY_JOB] == [{"targets": ["10.0.0.2:8001", "127.0.0.1:8000"], "labels": {"deployment": "prod"}}]
    assert groups[REPLICA_JOB] == [
        {"targets": ["127.0.0.1:30001"], "labels": {"deployment": "prod", "replica": "s0", "tier": "small"}}
    ]


def test_short_intervals_keep_the_timeout_within_them(tmp_path: Path) -> None:
    cfg = tmp_path / "prometheus.yml"
    write_config(cfg, "t", [Target("127.0.0.1:9")], scrape_interval_s=0.5, evaluation_interval_s=1)
    _check_config(cfg)
    assert yaml.safe_load(cfg.read_text())["global"] == {
        "scrape_interval": "500ms",
        "scrape_timeout": "500ms",
        "evaluation_interval": "1s",
    }
    assert _targets(cfg)[REPLICA_JOB] == []


@pytest.mark.parametrize("url", ["http://nohost", "not a url:x"])
def test_a_target_without_a_port_is_a_one_line_error(url: str) -> None:
    with pytest.raises(BouteError, match="expected http://HOST:PORT"):
        _ = Target(url).address
    with pytest.raises(BouteError, match="must be positive"):
        duration(0)


def test_a_deployment_remembers_its_config_and_a_rollout_refreshes_the_targets(tmp_path: Path) -> None:
    """What ``boute deploy up --prometheus-config`` and every later rollout do, on a deployment's state."""
    from boute.cli.prometheus_config import CONFIG_KEY, for_deployment, refresh_deployment

    d = tmp_path / "deploy"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"target": "local"}))
    dead = [free_port(), free_port()]  # nothing listens: replicas that export no metrics are left out
    state = {
        "registry": {"prefix": "shop", "redis_url": "redis://x"},
        "gateway_url": "http://127.0.0.1:8000",
        "replicas": [{"id": f"r{i}", "tier": "small", "url": f"http://127.0.0.1:{p}"} for i, p in enumerate(dead)],
    }
    cfg = tmp_path / "prometheus.yml"
    line = for_deployment(cfg, d, state)
    assert "deployment 'shop': 1 gateway(s), 0 of 2 replica(s) export metrics" in line
    _check_config(cfg)
    assert json.loads((d / "config.json").read_text()) == {"target": "local", CONFIG_KEY: str(cfg.resolve())}
    refresh_deployment(d, {**state, "gateway_url": "http://127.0.0.1:8100"})
    assert _targets(cfg)[GATEWAY_JOB] == [{"targets": ["127.0.0.1:8100"], "labels": {"deployment": "shop"}}]
    line = for_deployment(cfg, d, {**state, "gateway_url": None})
    assert "no gateway runs in this deployment" in line


@pytest.mark.timeout(120)  # starts emulated replicas and a gateway
def test_serve_writes_a_config_for_its_gateway(tmp_path: Path) -> None:
    from boute.cli.prometheus_config import exports_metrics

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(TEST_PLAN))
    cfg = tmp_path / "obs" / "prometheus.yml"
    port = free_port()
    cmd = [sys.executable, "-m", "boute.cli.main", "serve", "--plan", str(plan), "--emulate", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--prometheus-config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for raw in proc.stdout:  # type: ignore[union-attr]
            lines.append(raw.decode())
            if lines[-1].startswith("ready:"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(120), "".join(lines)
        out = "".join(lines)
        # the emulated replicas export no metrics (404): only the gateway is a target
        assert f"prometheus config: {cfg}" in out and "1 gateway(s), 0 of 3 replica(s) export metrics" in out, out
        registry = Path(out.split("registry ", 1)[1].split()[0])
        assert not any(exports_metrics(b["url"]) for b in json.loads(registry.read_text()))
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/ready", 5, [proc])
        assert exports_metrics(url)
        _check_config(cfg)
        assert _targets(cfg)[GATEWAY_JOB] == [{"targets": [f"127.0.0.1:{port}"], "labels": {"deployment": "plan"}}]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(timeout=10)
    assert proc.returncode == 0, "".join(lines)
