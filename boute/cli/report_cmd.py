"""``boute report``: an experiment of the tracking DB as one self-contained HTML page (docs/report.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from boute.cli.options import TRACKING_DB


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)


def report_cmd(
    experiment: str | None = typer.Argument(None, help="experiment name or id (default: the newest)"),
    out: Path = typer.Option(..., "--out", "-o", help="HTML file to write"),
    db: str | None = TRACKING_DB,
) -> None:
    """One HTML file, nothing fetched when it is opened: the Pareto front, the best plan over evaluations and
    wall time (beside the same problem's other strategies), where the time went, the plan's deployment and,
    once verified, promised vs measured."""
    from boute.report.publish import write_report

    path = write_report(db, experiment, out)
    typer.echo(f"report written: {path}")
