"""Ctrl-C and SIGTERM as the way a long-running command ends, whatever the process inherited.

A shell starts background jobs (``cmd &``) with SIGINT ignored, and Python then installs no Ctrl-C
handler: ``kill -INT`` would do nothing to ``boute serve`` or ``boute replan`` started that way.
SIGTERM (what supervisors and containers send) would kill without the orderly stop. Both are set here
to raise, so the command unwinds through its own cleanup.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwind as Ctrl-C does (Click turns both into "aborted", exit 130)."""


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextmanager
def stop_signals() -> Iterator[None]:
    """Within the block, SIGINT raises KeyboardInterrupt and SIGTERM :class:`Terminated`."""
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    old_term = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
