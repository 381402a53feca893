"""Process supervision with real processes: a tiny HTTP server script started, crashed, restarted, stopped."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from backends.supervisor import (
    ProcessSpec,
    ReadinessError,
    RestartPolicy,
    SupervisedProcess,
    Supervisor,
    backoff_delay,
)
from tests.services import free_port
from tests.waits import SAFETY_S

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)

SERVER = textwrap.dedent(
    """
    import os, signal, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer

    port, mode = int(sys.argv[1]), sys.argv[2]
    delay = float(os.environ.get("READY_DELAY", "0"))
    print(f"server pid {os.getpid()} mode {mode}", flush=True)
    if mode == "fail":
        print("fatal: model file not found", flush=True)
        sys.exit(3)
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
    time.sleep(delay)

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/crash":
                os._exit(7)
            body = str(os.getpid()).encode()
            self.send_response(200 if self.path in ("/health", "/pid") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", port), H)
    srv.timeout = 0.2
    while True:
        srv.handle_request()
    """
)

FAST = RestartPolicy(backoff_initial_s=0.05, backoff_max_s=0.4, stable_after_s=60.0)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "server.py"
    p.write_text(SERVER)
    return p


def _spec(script: Path, mode: str = "ok", name: str = "r0", **env: str) -> tuple[ProcessSpec, int]:
    port = free_port()
    spec = ProcessSpec(
        name=name,
        argv=(sys.executable, str(script), str(port), mode),
        env=env,
        health_url=f"http://127.0.0.1:{port}/health",
    )
    return spec, port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_backoff_grows_and_caps() -> None:
    p = RestartPolicy(backoff_initial_s=0.5, backoff_factor=2.0, backoff_max_s=3.0)
    assert [backoff_delay(p, n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_ready_crash_restart_and_graceful_stop(script: Path, tmp_path: Path) -> None:
    spec, port = _spec(script, READY_DELAY="0.3")
    proc = SupervisedProcess(spec, tmp_path / "logs", FAST).start()
    try:
        waited = proc.wait_ready(timeout_s=SAFETY_S)
        assert waited >= 0.25  # it really waited for the delayed server
        first_pid = int(httpx.get(f"http://127.0.0.1:{port}/pid").text)
        assert first_pid == proc.pid
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/crash", timeout=2)
        proc.wait_ready(timeout_s=SAFETY_S)  # back after a restart
        second_pid = int(httpx.get(f"http://127.0.0.1:{port}/pid").text)
        assert second_pid != first_pid
        assert proc.restarts == 1 and proc.exit_codes == [7]
    finally:
        code = proc.stop(grace_s=5)
    assert code == -signal.SIGTERM
    assert not _alive(second_pid)
    log = proc.log_path.read_text()
    assert log.count("=== start #") == 2 and "exited with code 7" in log and f"server pid {second_pid}" in log


def test_stop_escalates_to_sigkill(script: Path, tmp_path: Path) -> None:
    spec, _ = _spec(script, mode="ignore-term")
    proc = SupervisedProcess(spec, tmp_path, FAST).start()
    proc.wait_ready(timeout_s=SAFETY_S)
    pid = proc.pid
    t0 = time.monotonic()
    code = proc.stop(grace_s=0.5)
    assert code == -signal.SIGKILL
    assert 0.4 < time.monotonic() - t0 < 8
    assert not _alive(pid)
    assert "SIGKILL" in proc.log_path.read_text()


def test_exit_before_ready_is_a_clear_error(script: Path, tmp_path: Path) -> None:
    spec, _ = _spec(script, mode="fail", name="bad")
    policy = RestartPolicy(backoff_initial_s=0.05, max_restarts=2)
    proc = SupervisedProcess(spec, tmp_path, policy).start()
    try:
        with pytest.raises(ReadinessError) as err:
            proc.wait_ready(timeout_s=SAFETY_S)
    finally:
        proc.stop(grace_s=1)
    msg = str(err.value)
    assert "'bad' exited with code 3" in msg and "model file not found" in msg and "\n" not in msg
    assert proc.exit_codes == [3, 3, 3]  # first run + 2 restarts, then it gave up


def test_readiness_timeout_names_url(script: Path, tmp_path: Path) -> None:
    spec, port = _spec(script, READY_DELAY=str(3 * SAFETY_S))
    proc = SupervisedProcess(spec, tmp_path, FAST).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(ReadinessError, match=rf"not ready at http://127.0.0.1:{port}/health after 0.8s"):
            proc.wait_ready(timeout_s=0.8)
        assert time.monotonic() - t0 < SAFETY_S  # gave up at its timeout, long before the server would answer
    finally:
        proc.stop(grace_s=2)


def test_supervisor_fleet_per_replica_logs(script: Path, tmp_path: Path) -> None:
    with Supervisor(tmp_path / "logs", FAST) as sup:
        specs = [_spec(script, name=f"tier-{i}")[0] for i in range(2)]
        sup.start_all(specs)
        waited = sup.wait_ready(timeout_s=SAFETY_S)
        assert set(waited) == {"tier-0", "tier-1"}
        pids = [p.pid for p in sup]
    assert not sup.processes
    assert all(not _alive(pid) for pid in pids if pid is not None)
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["tier-0.log", "tier-1.log"]
