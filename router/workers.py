"""Several gateway worker processes on one port: the supervisor that starts, replaces and stops them.

Why processes: one gateway is one event loop, so it uses one core; ``--workers N`` runs N of them. Each
worker binds the port itself with ``SO_REUSEPORT`` (:func:`worker_socket`), so the kernel spreads incoming
connections over the workers' listening sockets by a hash of the connection's addresses, with no accept
lock and no thundering herd, and a worker receives connections only once it listens, i.e. after its
start-up (plan compiled, shared state synced, replicas checked). The workers are the same gateway as one
process, HTTP fast path included; what they share goes through Redis as between gateways on different
hosts (:mod:`router.state`: plan, registry, down-marks, events), which is why more than one worker needs
``redis_url``. Their metrics meet in the run folder (:mod:`router.worker_metrics`).

The supervisor (this module, the process ``python -m router --workers N`` starts) serves nothing itself:

- **start-up**: N workers; each writes ``<pid>.ready`` in the run folder once it listens. A worker that exits
  before it was ready (port taken, plan that cannot be served) stops the whole serve with its exit code: a
  replacement would fail the same way.
- **a worker dies later** (crash, OOM kill): it is replaced, and its connections are lost (SO_REUSEPORT:
  connections waiting in the dead worker's accept queue are reset). More than ``MAX_RESTARTS`` replacements
  within ``RESTART_WINDOW_S`` stop the serve (exit 1): a worker that keeps dying is not hidden.
- **SIGTERM or SIGINT** (Ctrl-C): each ready worker gets one SIGINT and drains (uvicorn stops accepting, waits
  for requests in flight up to ``drain_timeout_s``), one still starting gets SIGTERM (it has nothing to drain,
  and a SIGINT would end its start-up with a KeyboardInterrupt traceback); after that and a margin, SIGKILL. Workers run in their own
  process group, so a terminal's Ctrl-C reaches them only through the supervisor, once: further signals are
  not passed on (a terminal's Ctrl-C and ``boute serve``'s stop both reach the supervisor, and uvicorn takes a
  second SIGINT as "quit now", cutting the drain short). Each worker asks the kernel for SIGTERM should the
  supervisor die (``PR_SET_PDEATHSIG``): a supervisor killed with SIGKILL leaves no worker behind.

Linux: SO_REUSEPORT balancing and PR_SET_PDEATHSIG are Linux's. Any process of the same user may bind the
port with SO_REUSEPORT as well and receive a share of its connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from types import FrameType

import uvicorn

from router.worker_metrics import WorkerMetrics, ready_file, retire

log = logging.getLogger("boute.router.workers")

#: replacements of dead workers tolerated within RESTART_WINDOW_S before the serve gives up
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
#: after the drain timeout, how long stopping workers get before SIGKILL
KILL_MARGIN_S = 5.0
#: the supervisor's poll period (worker exits and readiness)
POLL_S = 0.1
#: environment variable naming the supervisor's pid to a worker (it exits if it was orphaned before it could
#: ask for PR_SET_PDEATHSIG)
PARENT_ENV = "BOUTE_WORKER_PARENT"


def worker_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with SO_REUSEPORT (every worker binds its own; the kernel balances
    new connections across those listening). Not listening yet: uvicorn listens once the app has started.
    OSError when the port is taken by a process that did not set SO_REUSEPORT, or by another user."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


def die_with_parent() -> None:
    """In a worker: SIGTERM (a graceful stop) when the supervisor dies, however it dies (Linux prctl); exit now
    if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    parent = os.environ.get(PARENT_ENV)
    if parent and os.getppid() != int(parent):
        sys.exit(1)


class WorkerServer(uvicorn.Server):
    """uvicorn's server, in a worker: says when it listens (``<pid>.ready``) and keeps its metrics snapshot
    written, a last time after the drain."""

    def __init__(self, config: uvicorn.Config, fleet: WorkerMetrics) -> None:
        super().__init__(config)
        self.fleet = fleet
        self.snapshots: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.fleet.mark_ready()
            self.snapshots = asyncio.create_task(self.fleet.run(), name="boute-metrics-snapshot")

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        if self.snapshots is not None:
            self.snapshots.cancel()
            await asyncio.gather(self.snapshots, return_exceptions=True)
        with contextlib.suppress(OSError):
            self.fleet.write()


class Supervisor:
    """Runs ``command`` (the worker's command line) N times and keeps them running until a stop signal."""

    def __init__(self, command: list[str], workers: int, drain_timeout_s: float) -> None:
        self.command, self.n, self.drain_timeout_s = command, workers, drain_timeout_s
        self.dir = Path(tempfile.mkdtemp(prefix="boute-workers-"))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.ready: set[int] = set()
        self.restarts: deque[float] = deque()
        self.stop_signal: int | None = None

    def run(self) -> int:
        """Until SIGTERM/SIGINT (exit 0) or a failure (a worker's exit code, or 1); every worker is gone on return."""
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for _ in range(self.n):
                self._spawn()
            return self._watch()
        finally:
            self._stop_all()
            for s, h in old.items():
                signal.signal(s, h)
            shutil.rmtree(self.dir, ignore_errors=True)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_signal = signum  # a second one changes nothing: the workers drain once (see the module docstring)

    def _signal_workers(self) -> None:
        """SIGINT to a ready worker (uvicorn drains it); SIGTERM to one still starting, which has nothing to drain:
        Python's default SIGINT would raise KeyboardInterrupt wherever its start-up is (an import, say) and print
        a traceback, while the default SIGTERM ends it quietly (and uvicorn, once listening, drains on either)."""
        for pid, proc in self.procs.items():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT if pid in self.ready else signal.SIGTERM)

    def _spawn(self) -> None:
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        cmd = [*self.command, "--worker-dir", str(self.dir)]
        proc = subprocess.Popen(cmd, env=env, process_group=0)
        self.procs[proc.pid] = proc

    def _watch(self) -> int:
        announced = False
        while self.stop_signal is None:
            for pid, proc in list(self.procs.items()):
                if pid not in self.ready and ready_file(self.dir, pid).exists():
                    self.ready.add(pid)
                code = proc.poll()
                if code is not None and self.stop_signal is None:
                    failed = self._exited(pid, code)
                    if failed is not None:
                        return failed
            if not announced and len(self.ready) == self.n:
                log.warning("%d gateway workers ready (pids %s)", self.n, " ".join(map(str, sorted(self.ready))))
                announced = True
            time.sleep(POLL_S)
        return 0

    def _exited(self, pid: int, code: int) -> int | None:
        """A worker exited on its own: the serve's exit code when it must stop, None once it is replaced."""
        del self.procs[pid]
        retire(self.dir, pid)
        if pid not in self.ready:
            log.error("gateway worker %d exited with %d before it was ready: stopping", pid, code)
            return code if code > 0 else 1
        self.ready.discard(pid)
        now = time.monotonic()
        self.restarts.append(now)
        while self.restarts and self.restarts[0] < now - RESTART_WINDOW_S:
            self.restarts.popleft()
        if len(self.restarts) > MAX_RESTARTS:
            log.error("gateway workers died %d times within %.0f s: stopping", len(self.restarts), RESTART_WINDOW_S)
            return 1
        self._spawn()
        log.warning("gateway worker %d exited with %d; replaced", pid, code)
        return None

    def _stop_all(self) -> None:
        """A stop signal to every worker (:meth:`_signal_workers`: they drain), then SIGKILL to any left after the drain timeout and a margin."""
        self._signal_workers()
        deadline = time.monotonic() + self.drain_timeout_s + KILL_MARGIN_S
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
