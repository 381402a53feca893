"""``boute serve --emulate``: one command brings up replicas + gateway; Ctrl-C stops all of it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from backends.emulated.launch import free_port, wait_http
from router.testing import TEST_PLAN


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
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/ready", 90, [proc])
        r = httpx.post(url + "/v1/completions", json={"model": "router-large", "prompt": "x", "max_tokens": 3})
        assert r.status_code == 200 and r.headers["x-boute-tier"] == "large"
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 0, out
    assert "ready:" in out
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
