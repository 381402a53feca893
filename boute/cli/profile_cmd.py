"""``boute profile perf|quality|runs|show``: measure a live engine's speed, or its answers' quality, from outside.

``perf`` runs a load sweep against an OpenAI-compatible endpoint, fits the performance model's efficiency
factors of the GPU type to the measurements and writes a calibration file (read by ``boute perf
--calibration`` and a scenario's ``calibration:``); the run, the fit and every load point's TTFT, TPOT and
throughput are recorded in the tracking DB (``--db``), which ``runs`` and ``show`` read back. ``quality``
runs a dataset through every tier and writes a quality profile the optimiser reads.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from backends.profile.calibrate import MeasuredReplica
    from backends.profile.loadgen import Api, LoadPoint, PointResult
    from backends.profile.quality import Tier
    from boute.catalog import Catalog

from boute.cli.options import TRACKING_DB
from boute.cli.profile_runs_cmd import register_runs
from boute.errors import BouteError


def _num(value: float | None, ndigits: int) -> float | None:
    """Rounded, or ``None`` for a figure that could not be measured (NaN): the summary stays valid JSON."""
    return None if value is None or not math.isfinite(value) else round(float(value), ndigits)


def _api(value: str) -> Api:
    """``--api``: the request API of the sweep (a one-line error for anything else)."""
    if value == "chat":
        return "chat"
    if value == "completions":
        return "completions"
    raise BouteError(f"--api: expected chat or completions, got '{value}'")


def _point_row(index: int, s: PointResult) -> dict[str, Any]:  # a profile_points row
    return {
        "index": index,
        "concurrency": s.point.concurrency,
        "rate_rps": s.point.rate_rps,
        "input_len": s.point.input_len,
        "output_len": s.point.output_len,
        "requests": s.point.requests,
        "completed": s.completed,
        "failed": s.failed,
        "input_tokens": s.mean_input_tokens,
        "output_tokens": s.mean_output_tokens,
        "ttft_ms_mean": s.ttft_ms_mean,
        "ttft_ms_p50": s.ttft_ms_p50,
        "ttft_ms_p95": s.ttft_ms_p95,
        "tpot_ms_mean": s.tpot_ms_mean,
        "tpot_ms_p50": s.tpot_ms_p50,
        "e2e_ms_mean": s.e2e_ms_mean,
        "throughput_rps": s.throughput_rps,
        "output_tokens_per_s": s.output_tokens_per_s,
        "wall_s": s.wall_s,
        "errors": list(s.errors),
    }


def _record(store: Any, url: str | None, run: dict[str, Any], points: list[dict[str, Any]]) -> int:
    """Write the run and its points in one transaction; a database failure is a one-line error."""
    from sqlalchemy.exc import SQLAlchemyError

    from boute.tracking import normalise_url

    try:
        return store.add_profile_run(run, points)
    except SQLAlchemyError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BouteError(
            f"--db: cannot record the profile run in {normalise_url(url)} "
            f"(calibration and results files were written): {first}"
        ) from None


def _ints(text: str, name: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BouteError(f"--{name}: expected comma-separated integers, got '{text}'") from None
    if not vals or min(vals) < 1:
        raise BouteError(f"--{name}: expected positive integers, got '{text}'")
    return vals


def _catalog(path: Path | None) -> Catalog:  # import kept local: light CLI start-up
    from boute.catalog import builtin_catalog, load_catalog_file

    return load_catalog_file(path) if path is not None else builtin_catalog()


def _tier(text: str, flag: str) -> Tier:
    from backends.profile.quality import Tier

    name, sep, url = text.partition("=")
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise BouteError(f"{flag}: expected NAME=URL (http...), got '{text}'")
    model = None
    if "@" in name:  # NAME@SERVED_MODEL=URL when the endpoint serves another model name
        name, model = name.split("@", 1)
    return Tier(name=name, url=url, model=model)


def _checked_catalog(path: Path | None, gpu: str, model: str) -> Catalog:
    """The catalog ``--catalog`` names (the built-in one by default), holding ``--gpu`` and ``--model``."""
    cat = _catalog(path)
    try:
        cat.gpu(gpu)
        cat.model(model)
    except KeyError as exc:
        raise BouteError(str(exc.args[0])) from None
    return cat


@dataclass(frozen=True)
class _Sweep:
    """The load points of ``profile perf``: every input x output x concurrency level (closed loop, at least
    ``--requests`` requests and one per concurrent client), then one open-loop point per ``--rates`` value at
    the first lengths. The parsed option values are recorded with the run."""

    concurrency: list[int]
    inputs: list[int]
    outputs: list[int]
    rates: list[float]
    points: list[LoadPoint]

    @classmethod
    def parse(cls, concurrency: str, inputs: str, outputs: str, requests: int, rates: str | None) -> _Sweep:
        from backends.profile.loadgen import LoadPoint

        conc_vals = _ints(concurrency, "concurrency")
        in_vals, out_vals = _ints(inputs, "input"), _ints(outputs, "output")
        points = [
            LoadPoint(concurrency=c, input_len=i, output_len=o, requests=max(requests, c))
            for i in in_vals
            for o in out_vals
            for c in conc_vals
        ]
        rate_vals: list[float] = []
        if rates:
            try:
                rate_vals = [float(r) for r in rates.split(",") if r.strip()]
            except ValueError:
                raise BouteError(f"--rates: expected comma-separated numbers, got '{rates}'") from None
            points += [LoadPoint(1, in_vals[0], out_vals[0], requests, rate_rps=r) for r in rate_vals]
        return cls(conc_vals, in_vals, out_vals, rate_vals, points)


def _fit(swept: list[PointResult], cat: Catalog, replica: MeasuredReplica, endpoint: str, out: Path) -> dict[str, Any]:
    """Fit the GPU type's efficiency factors to the sweep and write the calibration file ``out``; returns the
    run's calibration record (the factors, and the median |error| of the model on the measured points
    before and after the fit)."""
    from backends.profile.calibrate import compare, fit_sweep, measured_points, write_calibration
    from boute.perf.calibration import apply_calibration, load_calibration

    mps = measured_points(swept, replica, source=f"boute profile perf {endpoint}")
    if not mps:
        errs = sorted({e for r in swept for e in r.errors})
        raise BouteError(f"{endpoint}: no successful measurements to fit ({'; '.join(errs)[:300]})")
    before = compare(mps, cat)
    fit = fit_sweep(mps, cat, replica.gpu)
    write_calibration(out, fit)
    after = compare(mps, apply_calibration(cat, load_calibration(out)))
    return {
        "efficiency": {k: round(float(v), 4) for k, v in fit.efficiency.model_dump(exclude_none=True).items()},
        "fitted": list(fit.fitted),
        "median_abs_error_pct_before": round(median(abs(r["error_pct"]) for r in before), 2),
        "median_abs_error_pct_after": round(median(abs(r["error_pct"]) for r in after), 2),
    }


def _summary_point(s: PointResult) -> dict[str, Any]:
    """One load point as ``profile perf`` prints it (rounded; None where it could not be measured)."""
    return {
        "concurrency": s.point.concurrency,
        "rate_rps": s.point.rate_rps,
        "input_tokens": _num(s.mean_input_tokens, 1),
        "output_tokens": _num(s.mean_output_tokens, 1),
        "ttft_ms": _num(s.ttft_ms_mean, 2),
        "tpot_ms": _num(s.tpot_ms_mean, 3),
        "throughput_rps": _num(s.throughput_rps, 3),
        "failed": s.failed,
    }


def perf_cmd(
    endpoint: str = typer.Option(..., "--endpoint", help="OpenAI-compatible base URL, e.g. http://host:30000"),
    model: str = typer.Option(..., "--model", help="catalog model name (architecture) being served"),
    gpu: str = typer.Option(..., "--gpu", help="catalog GPU type the replica runs on"),
    served_model: str | None = typer.Option(None, "--served-model", help="model name in requests (default --model)"),
    tp: int = typer.Option(1, "--tp"),
    pp: int = typer.Option(1, "--pp"),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 or fp8 (fp8 also stands for 8-bit/4-bit GGUF)"),
    concurrency: str = typer.Option("1,2,4,8", "--concurrency", help="closed-loop concurrency levels"),
    rates: str | None = typer.Option(None, "--rates", help="open-loop request rates (req/s), recorded only"),
    inputs: str = typer.Option("128", "--input", help="prompt lengths in tokens (comma-separated)"),
    outputs: str = typer.Option("64", "--output", help="output lengths in tokens (comma-separated)"),
    requests: int = typer.Option(16, "--requests", help="requests per load point"),
    max_batch: int | None = typer.Option(None, "--max-batch", help="engine's concurrency cap (1: serial server)"),
    api: str = typer.Option("chat", "--api", help="chat or completions"),
    catalog: Path | None = typer.Option(None, "--catalog", help="extra GPU/model catalog YAML"),
    out: Path = typer.Option(Path("calibration.yaml"), "--out", help="calibration file to write or update"),
    results: Path | None = typer.Option(None, "--results", help="raw sweep JSON (default: <out>.results.json)"),
    db: str | None = TRACKING_DB,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Load-sweep a live endpoint, fit efficiency factors for GPU type --gpu, write the calibration file.

    The run, the fit and every load point (TTFT, TPOT, throughput) are recorded in the tracking DB."""
    from backends.profile.calibrate import MeasuredReplica
    from backends.profile.calibrate import write_results as save_results
    from backends.profile.loadgen import run_sweep
    from boute.tracking import open_store

    api_kind = _api(api)
    cat = _checked_catalog(catalog, gpu, model)
    sweep = _Sweep.parse(concurrency, inputs, outputs, requests, rates)
    store = open_store(db)  # before the sweep: an unreachable DB fails in seconds, not after it
    try:
        swept = run_sweep(endpoint, served_model or model, sweep.points, api=api_kind)
        replica = MeasuredReplica(model=model, gpu=gpu, tp=tp, pp=pp, dtype=dtype, max_batch=max_batch)
        calibration = _fit(swept, cat, replica, endpoint, out)
        meta = {"endpoint": endpoint, "model": model, "gpu": gpu, "tp": tp, "pp": pp, "dtype": dtype}
        raw = results or out.with_suffix(".results.json")
        save_results(raw, swept, meta)
        settings = {
            "api": api,
            "served_model": served_model or model,
            "concurrency": sweep.concurrency,
            "rates": sweep.rates,
            "inputs": sweep.inputs,
            "outputs": sweep.outputs,
            "requests": requests,
            "max_batch": max_batch,
            "catalog": str(catalog) if catalog is not None else None,
            "results": str(raw.resolve()),
        }
        run = {
            **meta,
            "kind": "perf",
            "settings": settings,
            "calibration": calibration,
            "calibration_path": str(out.resolve()),
            "status": "partial" if any(s.failed for s in swept) else "complete",
        }
        run_id = _record(store, db, run, [_point_row(i, s) for i, s in enumerate(swept)])
    finally:
        store.close()
    summary = {
        "calibration": str(out),
        "results": str(raw),
        "profile_run": run_id,
        **calibration,
        "points": [_summary_point(s) for s in swept],
    }
    typer.echo(json.dumps(summary, indent=None if as_json else 2))


def quality_cmd(
    dataset: str = typer.Option("builtin:gsm8k-test", "--dataset", help="builtin:gsm8k-test or a JSONL file"),
    tier: list[str] = typer.Option(..., "--tier", help="NAME=URL (or NAME@SERVED_MODEL=URL), repeatable"),
    judge: str | None = typer.Option(None, "--judge", help="judge endpoint URL (or NAME@MODEL=URL)"),
    cascade_judge: str | None = typer.Option(
        None,
        "--cascade-judge",
        help="NAME@MODEL=URL: also rate every answer with this LLM judge, as the gateway's cascade would, "
        "and record its scores and latency (what `quality.judge: llm` cuts thresholds on)",
    ),
    judge_timeout: float | None = typer.Option(
        None, "--judge-timeout", help="seconds before a cascade-judge call scores 0.0 (default: the gateway's, 10)"
    ),
    limit: int | None = typer.Option(None, "--limit", help="first N examples only"),
    max_tokens: int = typer.Option(512, "--max-tokens"),
    concurrency: int = typer.Option(4, "--concurrency"),
    instruction: str | None = typer.Option(None, "--instruction", help="text put before each question"),
    out: Path = typer.Option(..., "--out", help="quality profile to write (JSONL)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run a dataset through every tier, score answers (GSM8K checker or judge), write a JSONL profile.

    With --cascade-judge, every answer is also rated by that LLM judge and its scores recorded, so
    `boute optimize --mode cascade --judge llm` cuts the cascade's thresholds on them."""
    from backends.profile.quality import GSM8K_INSTRUCTION, Tier, load_dataset, profile_quality
    from boute.serving.timeouts import JUDGE_TIMEOUT_S

    if limit is not None and limit < 1:
        raise BouteError(f"--limit must be >= 1, got {limit}")
    tiers = [_tier(t, "--tier") for t in tier]
    judge_tier: Tier | None = None
    if judge is not None:
        judge_tier = _tier(judge, "--judge") if "=" in judge else Tier(name="judge", url=judge)
    cascade_tier = _tier(cascade_judge, "--cascade-judge") if cascade_judge is not None else None
    if judge_timeout is not None and judge_timeout <= 0:
        raise BouteError(f"--judge-timeout must be > 0, got {judge_timeout}")
    examples = load_dataset(dataset, limit)
    summary = profile_quality(
        examples,
        tiers,
        out,
        judge=judge_tier,
        cascade_judge=cascade_tier,
        judge_timeout_s=JUDGE_TIMEOUT_S if judge_timeout is None else judge_timeout,
        max_tokens=max_tokens,
        concurrency=concurrency,
        instruction=GSM8K_INSTRUCTION if instruction is None else instruction,
    )
    typer.echo(json.dumps(summary, indent=None if as_json else 2))


def register(app: typer.Typer) -> None:
    profile = typer.Typer(
        help="Profile live engines: performance (calibration; runs recorded in the tracking DB) and answer quality."
    )
    app.add_typer(profile, name="profile")
    profile.command("perf")(perf_cmd)
    register_runs(profile)
    profile.command("quality")(quality_cmd)
