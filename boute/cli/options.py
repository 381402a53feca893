"""Option value checks shared by the commands: a bad value is a one-line usage error (exit 2)."""

from __future__ import annotations

import typer


def positive(value: float | None) -> float | None:
    """Typer callback: the value must be > 0 (Typer's ``min=`` cannot say "strictly")."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"must be > 0, got {value:g}")
    return value


def fraction(value: float | None) -> float | None:
    """Typer callback: the value must lie in [0, 1]."""
    if value is not None and not 0 <= value <= 1:
        raise typer.BadParameter(f"must be in [0, 1], got {value:g}")
    return value
