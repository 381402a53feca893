"""``boute ARGS`` in-process through the real entry point, the way most CLI tests run it.

In-process rather than as a subprocess: the test shares its already-loaded libraries and quality models, and
the exit code and output are still exactly what :func:`boute.cli.main.main` gives a shell.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest


class CliResult(NamedTuple):
    """What a shell would see (a tuple too, so ``code, out, err = run_cli(...)`` works)."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str] | None = None) -> CliResult:
    """Run ``boute ARGS``; with ``capsys``, what it printed (output from before the call is discarded)."""
    from boute.cli.main import main

    if capsys is not None:
        capsys.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr() if capsys is not None else ("", "")
    return CliResult(code, out, err)
