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


def register(app: typer.Typer) -> None:
    @app.command("perf")
    def perf_cmd(
        model: str = typer.Option(..., "--model", "-m", help="model name from the catalog, e.g. llama-3.1-8b"),
        gpu: str = typer.Option(..., "--gpu", "-g", help="GPU type from the catalog, e.g. h100-sxm"),
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
