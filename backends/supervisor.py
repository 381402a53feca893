"""Supervision of replica processes (SGLang, llama.cpp, emulated backends): any command that serves HTTP.

Why a supervisor of our own: a serving fleet must survive a crashed engine (restart it, but not in a tight
loop that hides a broken config), must not register an endpoint before it answers (readiness wait with a
deadline and an error that says why), must keep each replica's output for post-mortems (one log file per
replica, appended across restarts) and must stop cleanly (SIGTERM to the replica's whole process group so
engine workers go too, then SIGKILL after a grace period).

Each process is started in its own session, so stopping it signals exactly its process group and never
anything else on the machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from boute.errors import BouteError

__all__ = [
    "ProcessSpec",
    "ReadinessError",
    "RestartPolicy",
    "SupervisedProcess",
    "Supervisor",
    "backoff_delay",
    "log_tail",
]


class ReadinessError(BouteError):
    """A replica did not answer its health URL in time, or exited before it did."""


#: flags whose value is a secret: logged as "***" (SGLang's --api-key carries BOUTE_REPLICA_TOKEN)
SECRET_FLAGS = frozenset({"--api-key"})


def shown_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as the log shows it: the values of :data:`SECRET_FLAGS` masked."""
    return ["***" if i and argv[i - 1] in SECRET_FLAGS else a for i, a in enumerate(argv)]


@dataclass(frozen=True)
class ProcessSpec:
    """What to run for one replica: a name (log file, messages), argv, extra env and its health URL."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    health_url: str | None = None
    cwd: str | None = None

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"replica '{self.name}': empty command")
        if not self.name or "/" in self.name:
            raise ValueError(f"replica name must be non-empty and contain no '/': {self.name!r}")


@dataclass(frozen=True)
class RestartPolicy:
    """Restart on crash with exponential back-off; a run that lasted ``stable_after_s`` resets the back-off."""

    restart: bool = True
    backoff_initial_s: float = 0.5
    backoff_factor: float = 2.0
    backoff_max_s: float = 30.0
    stable_after_s: float = 30.0
    max_restarts: int | None = None


def backoff_delay(policy: RestartPolicy, consecutive_failures: int) -> float:
    """Delay before restart number ``consecutive_failures`` (1-based): initial * factor^(n-1), capped."""
    n = max(1, consecutive_failures)
    return min(policy.backoff_max_s, policy.backoff_initial_s * policy.backoff_factor ** (n - 1))


def log_tail(path: Path, lines: int = 5, max_bytes: int = 8192) -> str:
    """Last non-empty lines of a log file, joined with ' | ' (for one-line error messages)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("=== ")]
    return " | ".join(kept[-lines:])


class SupervisedProcess:
    """One replica process, restarted on crash by a monitor thread until :meth:`stop` is called."""

    def __init__(self, spec: ProcessSpec, log_dir: str | Path, policy: RestartPolicy | None = None) -> None:
        self.spec = spec
        self.policy = policy or RestartPolicy()
        self.log_path = Path(log_dir) / f"{spec.name}.log"
        self.exit_codes: list[int] = []
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._gave_up = False
        self._monitor: threading.Thread | None = None

    # ---- state ----------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def restarts(self) -> int:
        return max(0, self.starts - 1)

    @property
    def gave_up(self) -> bool:
        """True when the process exited and the policy allows no further restart."""
        return self._gave_up

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> SupervisedProcess:
        if self._monitor is not None:
            raise RuntimeError(f"replica '{self.spec.name}' already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._spawn()
        self._monitor = threading.Thread(target=self._watch, name=f"supervise-{self.spec.name}", daemon=True)
        self._monitor.start()
        return self

    def _spawn(self) -> None:
        assert self._log is not None
        self.starts += 1
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._log.write(f"=== start #{self.starts} at {stamp}: {' '.join(shown_argv(self.spec.argv))}\n".encode())
        self._log.flush()
        env = {**os.environ, **self.spec.env}
        with self._lock:
            self._proc = subprocess.Popen(
                list(self.spec.argv),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.spec.cwd,
                start_new_session=True,  # own process group: stop() signals the replica and its children only
            )

    def _watch(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            proc = self._proc
            assert proc is not None
            started = time.monotonic()
            while proc.poll() is None and not self._stopping.wait(0.1):
                pass
            if self._stopping.is_set():
                return
            code = proc.returncode
            self.exit_codes.append(code)
            failures = 1 if time.monotonic() - started >= self.policy.stable_after_s else failures + 1
            limit = self.policy.max_restarts
            if not self.policy.restart or (limit is not None and self.restarts >= limit):
                self._note(f"exited with code {code}; not restarting")
                self._gave_up = True
                return
            delay = backoff_delay(self.policy, failures)
            self._note(f"exited with code {code}; restart in {delay:.2f}s")
            if self._stopping.wait(delay):
                return
            self._spawn()

    def _note(self, text: str) -> None:
        if self._log is not None and not self._log.closed:
            self._log.write(f"=== supervisor: {self.spec.name} {text}\n".encode())
            self._log.flush()

    def wait_ready(self, timeout_s: float = 120.0, interval_s: float = 0.2) -> float:
        """Block until the health URL answers 2xx; returns the seconds waited.

        Raises :class:`ReadinessError` on timeout, or at once when the process exited for good, with the
        last log lines so the user sees the engine's own complaint.
        """
        import httpx

        if self.spec.health_url is None:
            raise ReadinessError(f"replica '{self.spec.name}': no health URL to wait on")
        t0 = time.monotonic()
        last = "no answer yet"
        with httpx.Client(timeout=max(1.0, interval_s * 5), trust_env=False) as client:
            while True:
                if self._gave_up:
                    raise ReadinessError(
                        f"replica '{self.spec.name}' exited with code {self.exit_codes[-1]} before it was ready "
                        f"(log {self.log_path}: {log_tail(self.log_path) or 'empty'})"
                    )
                if self.running:
                    try:
                        r = client.get(self.spec.health_url)
                        if 200 <= r.status_code < 300:
                            return time.monotonic() - t0
                        last = f"HTTP {r.status_code}"
                    except httpx.HTTPError as exc:
                        last = type(exc).__name__
                waited = time.monotonic() - t0
                if waited >= timeout_s:
                    raise ReadinessError(
                        f"replica '{self.spec.name}' not ready at {self.spec.health_url} after {timeout_s:g}s "
                        f"({last}; {self.restarts} restarts; log {self.log_path}: "
                        f"{log_tail(self.log_path) or 'empty'})"
                    )
                time.sleep(min(interval_s, max(0.0, timeout_s - waited)))

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; returns the last exit code."""
        self._stopping.set()
        if self._monitor is not None:
            self._monitor.join(timeout=5.0)
        with self._lock:
            proc = self._proc
        code: int | None = None
        if proc is not None:
            if proc.poll() is None:
                self._signal(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    self._note(f"did not stop within {grace_s:g}s of SIGTERM; sending SIGKILL")
                    self._signal(proc, signal.SIGKILL)
                    proc.wait(timeout=10.0)
            else:  # already gone; children it left in its group still get the signal
                self._signal(proc, signal.SIGTERM)
            code = proc.returncode
        self._note(f"stopped (exit code {code})")
        if self._log is not None:
            self._log.close()
        return code

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


class Supervisor:
    """A set of supervised replicas: start them, wait until all are ready, stop them all (also on error)."""

    def __init__(self, log_dir: str | Path, policy: RestartPolicy | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.policy = policy
        self.processes: dict[str, SupervisedProcess] = {}

    def start(self, spec: ProcessSpec, policy: RestartPolicy | None = None) -> SupervisedProcess:
        if spec.name in self.processes:
            raise ValueError(f"replica '{spec.name}' is already supervised")
        proc = SupervisedProcess(spec, self.log_dir, policy or self.policy)
        self.processes[spec.name] = proc.start()
        return proc

    def start_all(self, specs: Sequence[ProcessSpec]) -> list[SupervisedProcess]:
        return [self.start(s) for s in specs]

    def wait_ready(self, timeout_s: float = 120.0) -> dict[str, float]:
        """Wait for every replica (one shared deadline); returns seconds each took."""
        deadline = time.monotonic() + timeout_s
        return {
            name: p.wait_ready(timeout_s=max(0.0, deadline - time.monotonic())) for name, p in self.processes.items()
        }

    def stop(self, name: str, grace_s: float = 10.0) -> int | None:
        return self.processes.pop(name).stop(grace_s)

    def stop_all(self, grace_s: float = 10.0) -> dict[str, int | None]:
        return {name: self.stop(name, grace_s) for name in list(self.processes)}

    def __iter__(self) -> Iterator[SupervisedProcess]:
        return iter(self.processes.values())

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
