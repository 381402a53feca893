"""Option value checks shared by the commands: a bad value is a one-line usage error (exit 2)."""

from __future__ import annotations

from pathlib import Path

import typer

#: the tracking DB option of the commands that read or write it (`boute experiments`, `boute profile`, `optimize`)
TRACKING_DB = typer.Option(None, "--db", help="tracking DB URL (default sqlite:///boute.db)")
#: the ``--report`` option of `boute optimize` and `boute verify`: the experiment's page (`boute report`)
REPORT = typer.Option(
    None, "--report", help="write the experiment's report here: one self-contained HTML file (as boute report)"
)
#: the deployment state folder option of `boute deploy ...`, `boute replan` and `boute status`
DEPLOY_DIR = typer.Option(None, "--dir", help="deployment state folder [~/.boute/deploy]")


def deployment_dir(directory: Path | None) -> Path:
    """The deployment folder a command works on: ``--dir``, else ``$BOUTE_DEPLOY_DIR`` or ~/.boute/deploy."""
    from backends.deploy.state import default_dir

    return (directory or default_dir()).expanduser().resolve()


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
