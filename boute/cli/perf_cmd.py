"""``boute perf``: the analytical performance model of one replica, from the command line.

An infeasible configuration (the model does not fit, TP does not divide the heads) is an answer, not an
error: it prints ``fits: false`` with the reason and exits 0. Unknown names and bad files exit 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from boute.errors import BouteError


def perf_report(
    model: str,
    gpu: str,
    *,
    tp: int = 1,
    pp: int = 1,
    dtype: str = "bf16",
    batch: int = 64,
    input_len: int = 128,
    output_len: int = 128,
    calibration: Path | None = None,
    scenario: Path | None = None,
) -> dict[str, Any]:
    """The JSON object ``boute perf --json`` prints (NaN-free: missing figures are ``None``)."""
    from boute.catalog import builtin_catalog
    from boute.perf import apply_calibration, load_calibration, replica_perf, scenario_catalog

    if scenario is not None:
        from boute.specs import load_scenario

        catalog = scenario_catalog(load_scenario(scenario))
    else:
        catalog = builtin_catalog()
    if calibration is not None:
        catalog = apply_calibration(catalog, load_calibration(calibration))
    if model not in catalog.models:
        raise BouteError(f"--model: unknown model '{model}' (known: {', '.join(sorted(catalog.models))})")
    if gpu not in catalog.gpus:
        raise BouteError(f"--gpu: unknown GPU '{gpu}' (known: {', '.join(sorted(catalog.gpus))})")
    spec = catalog.gpu(gpu)
    perf = replica_perf(catalog.model(model), spec, tp, pp, dtype)
    out: dict[str, Any] = {
        "model": model,
        "gpu": gpu,
        "tp": tp,
        "pp": pp,
        "dtype": dtype,
        "gpus": tp * pp,
        "batch_requested": batch,
        "input": input_len,
        "output": output_len,
        "fits": perf.fits,
        "reason": perf.reason or None,
        "weights_gb_per_gpu": round(perf.weights_gb_per_gpu, 3),
        "kv_gb_per_gpu": round(perf.kv_gb_per_gpu, 3),
        "kv_capacity_tokens": perf.kv_capacity_tokens,
        "max_batch": perf.max_batch(input_len, output_len),
        "price_per_hour": round(spec.price_per_hour * tp * pp, 4),
        "efficiency": spec.efficiency.model_dump(exclude_none=True),
        "approximate": "analytical roofline model calibrated on published static-batch rows; see docs/perf-model.md",
    }
    res = perf.static_batch(batch, input_len, output_len) if perf.fits else {}
    for key in ("batch", "ttft_ms", "tpot_ms", "e2e_ms", "output_tokens_per_s"):
        val = res.get(key)
        out[key] = None if val is None or (isinstance(val, float) and math.isnan(val)) else round(float(val), 3)
    if out["batch"] is not None:
        out["batch"] = int(out["batch"])
        if out["batch"] < batch:
            out["reason"] = f"batch capped at {out['batch']} by KV capacity ({perf.kv_capacity_tokens} tokens)"
    return out


def _print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    title = f"{report['model']} on {report['gpus']} x {report['gpu']} (tp={report['tp']}, pp={report['pp']}, {report['dtype']})"
    table = Table(title=title, show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    keys = (
        "fits",
        "reason",
        "weights_gb_per_gpu",
        "kv_capacity_tokens",
        "max_batch",
        "batch",
        "ttft_ms",
        "tpot_ms",
        "e2e_ms",
        "output_tokens_per_s",
        "price_per_hour",
    )
    for key in keys:
        if report.get(key) is not None or key == "fits":
            table.add_row(key, f"{report[key]:,}" if isinstance(report[key], float) else str(report[key]))
    console = Console()
    console.print(table)
    console.print("[dim]approximate: " + report["approximate"] + "[/dim]")


def validate_report(*, stored: bool = False, quick: bool = False) -> dict[str, Any]:
    """What ``boute perf validate --json`` prints: held-out errors on the published dataset."""
    from boute.perf.validate import REPORT_PATH, report

    if stored:
        return json.loads(REPORT_PATH.read_text())
    return report(splits=("source",) if quick else ("source", "gpu"))


def _print_validation(rep: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for split in ("leave_one_source_out", "leave_one_gpu_out", "in_sample"):
        if split not in rep:
            continue
        table = Table(title=split.replace("_", " "), show_header=True)
        for col in ("group", "rows", "median |err| %", "p90 |err| %"):
            table.add_column(col, justify="right" if col != "group" else "left")
        sec = rep[split]
        table.add_row("all", str(sec["all"]["rows"]), str(sec["all"]["median_abs_pct"]), str(sec["all"]["p90_abs_pct"]))
        for by in ("metric", "gpu_family"):
            for g, st in sec[by].items():
                table.add_row(f"{by}={g}", str(st["rows"]), str(st.get("median_abs_pct")), str(st.get("p90_abs_pct")))
        console.print(table)
    if "meets_goal" in rep:
        console.print(f"goal (leave-one-source-out median <= 10%, p90 <= 25%): {rep['meets_goal']}")


def register(app: typer.Typer) -> None:
    perf_app = typer.Typer(
        invoke_without_command=True,
        no_args_is_help=False,
        help="The analytical performance model: one replica (options), or `validate` it on published data.",
    )

    @perf_app.callback()
    def perf_cmd(
        ctx: typer.Context,
        model: str | None = typer.Option(None, "--model", "-m", help="model name from the catalog, e.g. llama-3.1-8b"),
        gpu: str | None = typer.Option(None, "--gpu", "-g", help="GPU type from the catalog, e.g. h100-sxm"),
        tp: int = typer.Option(1, "--tp", min=1, help="tensor-parallel degree"),
        pp: int = typer.Option(1, "--pp", min=1, help="pipeline-parallel degree"),
        dtype: str = typer.Option("bf16", "--dtype", help="bf16 or fp8 (weights and KV cache)"),
        batch: int = typer.Option(64, "--batch", min=1, help="static batch size"),
        input_len: int = typer.Option(128, "--input", min=1, help="prompt tokens per request"),
        output_len: int = typer.Option(128, "--output", min=1, help="output tokens per request"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        calibration: Path | None = typer.Option(None, "--calibration", help="calibration file (efficiency factors)"),
        scenario: Path | None = typer.Option(None, "--scenario", "-s", help="scenario whose catalog to use"),
    ) -> None:
        """Predict memory, TTFT, TPOT and throughput of one replica for a static batch (approximate)."""
        if ctx.invoked_subcommand is not None:
            return
        if model is None or gpu is None:
            raise BouteError("boute perf: --model and --gpu are required (or run `boute perf validate`)")
        if dtype not in ("bf16", "fp8"):
            raise BouteError(f"--dtype: must be bf16 or fp8, got '{dtype}'")
        report = perf_report(
            model,
            gpu,
            tp=tp,
            pp=pp,
            dtype=dtype,
            batch=batch,
            input_len=input_len,
            output_len=output_len,
            calibration=calibration,
            scenario=scenario,
        )
        if as_json:
            typer.echo(json.dumps(report))
        else:
            _print_table(report)

    @perf_app.command("validate")
    def validate_cmd(
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        quick: bool = typer.Option(False, "--quick", help="leave-one-source-out only (about half the time)"),
        stored: bool = typer.Option(
            False, "--stored", help="print the packaged report (boute/perf/data/validation.json) without re-fitting"
        ),
    ) -> None:
        """Held-out error of the performance model on published measurements (re-fits: a few minutes)."""
        rep = validate_report(stored=stored, quick=quick)
        if as_json:
            typer.echo(json.dumps(rep))
        else:
            _print_validation(rep)

    app.add_typer(perf_app, name="perf")
