"""``boute serve --emulate``: one command brings up replicas + gateway; Ctrl-C stops all of it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from backends.emulated.launch import free_port, wait_http
from tests.stack import TEST_PLAN

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)


def test_serve_emulate_ready_then_ctrl_c_stops_everything(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(TEST_PLAN))
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "boute.cli.main",
        "serve",
        "--plan",
        str(plan),
        "--emulate",
        "--port",
        str(port),
        "--speedup",
        "50",
        "--affinity",  # through to the gateway's flag: the plan has no affinity section
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:  # the command says "ready:" only once its own /ready check passed
        for raw in proc.stdout:  # type: ignore[union-attr]
            lines.append(raw.decode())
            if lines[-1].startswith("ready:"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(120), "".join(lines)
        wait_http(url + "/ready", 5, [proc])
        r = httpx.post(url + "/v1/completions", json={"model": "router-large", "prompt": "x", "max_tokens": 3})
        assert r.status_code == 200 and r.headers["x-boute-tier"] == "large"
        metrics = httpx.get(url + "/metrics").text
        assert 'boute_affinity_routed_total{reason="new_prefix",tier="large"} 1.0' in metrics
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(timeout=10)
    out = "".join(lines)
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    registry = Path(out.split("registry ", 1)[1].split()[0])
    urls = [b["url"] for b in json.loads(registry.read_text())]
    assert len(urls) == 3
    for u in urls:
        try:
            httpx.get(u + "/health", timeout=0.5)
            raise AssertionError(f"{u} still answers after Ctrl-C")
        except httpx.HTTPError:
            pass
    try:
        httpx.get(url + "/health", timeout=0.5)
        raise AssertionError("gateway still answers after Ctrl-C")
    except httpx.HTTPError:
        pass


def test_serve_without_backends_is_a_one_line_error(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(TEST_PLAN))
    r = subprocess.run(
        [sys.executable, "-m", "boute.cli.main", "serve", "--plan", str(plan)], capture_output=True, text=True
    )
    assert r.returncode == 2 and r.stderr.strip().startswith("error: serve: give --emulate")
