"""``boute experiments list|show|export``: read the tracking database."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from boute.cli.options import TRACKING_DB

experiments_app = typer.Typer(help="Inspect tracked optimisation experiments.", no_args_is_help=True)


def _load(db: str | None, ref: str) -> tuple[dict, list, list, list]:
    """The experiment (as a dict), its trial rows, Pareto fronts and plans, read in one go."""
    from boute.errors import BouteError
    from boute.tracking import open_store

    store = open_store(db)
    try:
        exp = store.experiment(ref)
        if exp is None:
            raise BouteError(f"experiments: no experiment named or numbered '{ref}'")
        info = {
            "id": exp.id,
            "name": exp.name,
            "scenario": exp.scenario,
            "strategy": exp.strategy,
            "evaluator": exp.evaluator,
            "seed": exp.seed,
            "status": exp.status,
            "settings": exp.settings,
            "created_at": exp.created_at.isoformat(timespec="seconds") if exp.created_at else None,
        }
        return info, store.trial_rows(exp.id), store.fronts(exp.id), store.plans(exp.id)
    finally:
        store.close()


@experiments_app.command("list")
def list_cmd(db: str | None = TRACKING_DB, as_json: bool = typer.Option(False, "--json")) -> None:
    """One line per experiment."""
    from boute.tracking import open_store

    store = open_store(db)
    try:
        rows = store.experiments()
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps(rows))
        return
    for r in rows:
        typer.echo(
            f"{r['id']:>4}  {r['name']:<48} {r['strategy']:<7} {r['evaluator']:<5} {r['trials']:>5} trials  {r['status']}"
        )


@experiments_app.command("show")
def show_cmd(ref: str = typer.Argument(..., help="experiment name or id"), db: str | None = TRACKING_DB) -> None:
    """Settings, trial counts, the plan written and the latest Pareto front (2-D or 3-D) of an experiment."""
    from boute.optimize.status import CONFIRMING, TrialStatus

    info, rows, fronts, plans = _load(db, ref)
    info["objective"] = (info.get("settings") or {}).get("objective", "latency")
    info["trials"] = len(rows)
    info["failed"] = sum(r.status == TrialStatus.FAILED for r in rows)
    info["confirmed"] = sum(r.status in CONFIRMING for r in rows)  # not search trials
    info["confirm_search"] = sum(r.status == TrialStatus.CONFIRM_SEARCH for r in rows)  # of which a confirming search
    screened = [r for r in rows if r.status == TrialStatus.SCREENED]  # removed by the screens: never evaluated
    info["screened"] = {
        "trials": len(screened),
        "capacity": sum((r.error or "").startswith("capacity") for r in screened),
        "quality": sum((r.error or "").startswith("quality") for r in screened),
    }
    info["eval_wall_s"] = round(sum(r.wall_s for r in rows), 3)
    if fronts:
        f = fronts[-1]
        axes = (f.axes or "quality,p95_latency_s").split(",")
        info["front"] = {
            "axes": axes,
            "evaluator": f.evaluator,
            "hypervolume": f.hypervolume,
            "n_trials": f.n_trials,
            "points": [{k: p.get(k) for k in ("trial", "quality", "p95_latency_s", "cost_per_hour")} for p in f.points],
        }
    if plans:
        info["plan"] = {
            "trial": plans[-1].trial_index,
            "path": plans[-1].path,
            "objective": plans[-1].plan.get("objective"),
            "predicted": plans[-1].plan.get("predicted"),
        }
    typer.echo(json.dumps(info, indent=2, default=str))


@experiments_app.command("export")
def export_cmd(
    ref: str = typer.Argument(..., help="experiment name or id"),
    out: Path | None = typer.Option(None, "--out", "-o", help="file to write (.json or .csv); default stdout JSON"),
    db: str | None = TRACKING_DB,
) -> None:
    """Every trial (parameters, metrics, timings) as JSON or CSV."""
    from boute.specs.io import write_atomic

    info, rows, fronts, plans = _load(db, ref)
    trials = [
        {
            "index": r.index,
            "status": r.status,
            "evaluator": r.evaluator,
            "wall_s": r.wall_s,
            "params": r.params,
            "metrics": r.metrics,
            "error": r.error,
        }
        for r in rows
    ]
    if out is not None and out.suffix == ".csv":
        import csv
        import io

        buf = io.StringIO()
        cols = [
            "index",
            "status",
            "evaluator",
            "quality",
            "p95_latency_s",
            "throughput_rps",
            "cost_per_hour",
            "fractions",
            "deployment",
            "wall_s",
        ]
        w = csv.writer(buf)
        w.writerow(cols)
        for t in trials:
            m = t["metrics"] or {}
            dep = ";".join(
                f"{g['tier']}/{g['gpu']}/{g['count']}x{g['tp']}x{g['pp']}" for g in t["params"]["deployment"]
            )
            w.writerow(
                [
                    t["index"],
                    t["status"],
                    t["evaluator"],
                    m.get("quality"),
                    m.get("p95_latency_s"),
                    m.get("throughput_rps"),
                    m.get("cost_per_hour"),
                    " ".join(f"{f:.4f}" for f in t["params"]["fractions"]),
                    dep,
                    t["wall_s"],
                ]
            )
        write_atomic(out, buf.getvalue())
        return
    doc = {
        "experiment": info,
        "trials": trials,
        "fronts": [{"evaluator": f.evaluator, "hypervolume": f.hypervolume, "points": f.points} for f in fronts],
        "plans": [{"trial": p.trial_index, "plan": p.plan, "confirmed": p.confirmed} for p in plans],
    }
    text = json.dumps(doc, indent=2, default=str) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        write_atomic(out, text)


def register(app: typer.Typer) -> None:
    app.add_typer(experiments_app, name="experiments")
