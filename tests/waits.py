"""Waiting in tests: for the event, never for wall-clock time; one safety bound, here.

A test waits for what it needs (a trial recorded, a replica idle, a plan adopted, a process ready), polling
at a short interval, and moves on the moment it happens. The bound is only the net that turns a hang into a
failure that says what did not happen. It is generous on purpose: on a busy machine (two pytest workers
beside a CPU-heavy job on 2 cores, issue 28) what takes 1 s here takes several, and no test may depend on
how fast the machine is (speed claims are measured by ``make bench``). A green run never waits for it.
pytest's per-test timeout (pyproject, and the marks on tests that start processes) stays the outer net.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable

#: the longest a test waits for one event before calling it hung (seconds)
SAFETY_S = 60.0


def until(
    pred: Callable[[], object],
    what: str,
    timeout: float = SAFETY_S,
    interval: float = 0.05,
    procs: Iterable[subprocess.Popen] = (),
) -> None:
    """Return once ``pred()`` is true; AssertionError naming ``what`` after ``timeout`` s, or at once when one of
    ``procs`` (the processes that should make it happen) has exited."""
    watched = list(procs)
    deadline = time.monotonic() + timeout
    while not pred():
        for p in watched:
            if p.poll() is not None:
                raise AssertionError(f"{what}: {p.args!r} exited with {p.returncode} first")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        time.sleep(interval)


async def until_async(
    pred: Callable[[], Awaitable[object]], what: str, timeout: float = SAFETY_S, interval: float = 0.05
) -> None:
    """:func:`until` for an awaitable predicate, inside a running event loop."""
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s")
        await asyncio.sleep(interval)
