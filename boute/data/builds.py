"""First-use builds of cached derived data, timed: what a first run pays and a second one does not.

Why: a search on a fresh cache distils the static embedding table (1-4 min on two cores), trains its
routers and verifier (seconds) and counts the profile's tokens (about a second); each result is kept
under :func:`boute.data.cache_dir`, so the next run only loads it. Without a name on the clock that time
showed up as ``other`` (issue 50: 16.9 s of a 32.5 s first run). Each build is wrapped in
:func:`building`; a caller that wants to know what a block built opens :func:`recording` around it and
gets, per kind of build, the seconds it took.

Times are exclusive: a build nested in another (the table distilled inside a router's training) counts
for itself only, so the kinds of one recording add up to the time spent building. Nothing is recorded
outside a recording; the log is a context variable, so a thread or a nested recording keeps its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

#: the kinds of build, in the order a first run meets them (what :func:`building` is called with)
KINDS = ("static", "embed", "router", "verifier", "tokens")


@dataclass
class _Log:
    seconds: dict[str, float] = field(default_factory=dict)
    inner: list[float] = field(default_factory=list)  # per open build: the seconds of builds nested in it


_LOG: ContextVar[_Log | None] = ContextVar("boute_builds", default=None)


@contextmanager
def building(kind: str) -> Iterator[None]:
    """Time the block as a build of ``kind`` (one of :data:`KINDS`) in the open recording, if any."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of build {kind!r} (known: {', '.join(KINDS)})")
    log = _LOG.get()
    if log is None:
        yield
        return
    log.inner.append(0.0)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        total = time.perf_counter() - t0
        nested = log.inner.pop()
        log.seconds[kind] = log.seconds.get(kind, 0.0) + max(0.0, total - nested)
        if log.inner:
            log.inner[-1] += total


@contextmanager
def recording() -> Iterator[dict[str, float]]:
    """Collect the builds of the block: ``{kind: seconds}`` (exclusive, module doc), filled as it runs."""
    log = _Log()
    token = _LOG.set(log)
    try:
        yield log.seconds
    finally:
        _LOG.reset(token)
