"""``boute profile runs|show``: the profiling runs the tracking DB recorded, listed or one in full."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.console import JustifyMethod

from boute.cli.options import TRACKING_DB
from boute.errors import BouteError


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


#: the columns of ``boute profile runs`` and how each is aligned
RUN_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("id", "right"),
    ("kind", "left"),
    ("gpu", "left"),
    ("model", "left"),
    ("tp x pp", "right"),
    ("dtype", "left"),
    ("points", "right"),
    ("err % before -> after", "right"),
    ("status", "left"),
    ("created", "left"),
)
#: the columns of ``boute profile show``'s load points: (heading, profile_points key)
POINT_COLUMNS = (
    ("#", "index"),
    ("conc", "concurrency"),
    ("rate", "rate_rps"),
    ("in tok", "input_tokens"),
    ("out tok", "output_tokens"),
    ("ok", "completed"),
    ("fail", "failed"),
    ("TTFT ms", "ttft_ms_mean"),
    ("TTFT p95", "ttft_ms_p95"),
    ("TPOT ms", "tpot_ms_mean"),
    ("req/s", "throughput_rps"),
    ("tok/s", "output_tokens_per_s"),
)


def runs_cmd(
    gpu: str | None = typer.Option(None, "--gpu", help="only runs of this catalog GPU type"),
    db: str | None = TRACKING_DB,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List the profiling runs recorded in the tracking DB."""
    from boute.tracking import open_store

    store = open_store(db)
    try:
        rows = store.profile_runs(gpu)
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps(rows))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="profiling runs" + (f" on {gpu}" if gpu else ""), show_header=True)
    for col, justify in RUN_COLUMNS:
        table.add_column(col, justify=justify)
    for r in rows:
        cal = r["calibration"] or {}
        err = f"{_fmt(cal.get('median_abs_error_pct_before'))} -> {_fmt(cal.get('median_abs_error_pct_after'))}"
        table.add_row(
            str(r["id"]),
            r["kind"],
            r["gpu"],
            r["model"],
            f"{r['tp']} x {r['pp']}",
            r["dtype"],
            str(r["points"]),
            err,
            r["status"],
            r["created_at"] or "-",
        )
    Console().print(table)


def show_cmd(
    run_id: str = typer.Argument(..., metavar="RUN_ID", help="profiling run id (see `boute profile runs`)"),
    db: str | None = TRACKING_DB,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """A recorded profiling run: endpoint, settings, fitted factors and every load point."""
    from boute.tracking import open_store

    if not run_id.strip().isdigit():
        raise BouteError(f"profile show: RUN_ID must be a run number, got '{run_id}'")
    store = open_store(db)
    try:
        run = store.profile_run(int(run_id))
        points = store.profile_points(int(run_id)) if run is not None else []
    finally:
        store.close()
    if run is None:
        raise BouteError(f"profile show: no profiling run numbered {int(run_id)} (see `boute profile runs`)")
    if as_json:
        typer.echo(json.dumps({**run, "points": points}, default=str))
        return
    _print_run(run, points)


def _print_run(run: dict[str, Any], points: list[dict[str, Any]]) -> None:
    """``boute profile show`` as text: the run's header line, its fitted factors and a table of its points."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]profile run {run['id']}[/bold] ({run['kind']}, {run['status']}, {run['created_at']}): "
        f"{run['model']} on {run['gpu']} tp={run['tp']} pp={run['pp']} {run['dtype']} at {run['endpoint']}"
    )
    cal = run["calibration"] or {}
    if cal:
        eff = ", ".join(f"{k}={v}" for k, v in (cal.get("efficiency") or {}).items())
        console.print(f"fitted {', '.join(cal.get('fitted') or []) or '-'}: {eff or '-'}")
        console.print(
            f"median |error| {_fmt(cal.get('median_abs_error_pct_before'))}% -> "
            f"{_fmt(cal.get('median_abs_error_pct_after'))}%; calibration file {run['calibration_path'] or '-'}"
        )
    table = Table(show_header=True)
    for head, _ in POINT_COLUMNS:
        table.add_column(head, justify="right")
    for p in points:
        table.add_row(*(_fmt(p[key]) for _, key in POINT_COLUMNS))
    console.print(table)


def register_runs(profile: typer.Typer) -> None:
    """Add ``runs`` and ``show`` to the ``boute profile`` group."""
    profile.command("runs")(runs_cmd)
    profile.command("show")(show_cmd)
