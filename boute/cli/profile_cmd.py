"""``boute profile perf|quality``: measure a live engine's speed, or its answers' quality, from outside.

``perf`` runs a load sweep against an OpenAI-compatible endpoint, fits the performance model's efficiency
factors of the GPU type to the measurements and writes a calibration file (read by ``boute perf
--calibration`` and a scenario's ``calibration:``). ``quality`` runs a dataset through every tier and
writes a quality profile the optimiser reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median

import typer

from boute.errors import BouteError


def _ints(text: str, name: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BouteError(f"--{name}: expected comma-separated integers, got '{text}'") from None
    if not vals or min(vals) < 1:
        raise BouteError(f"--{name}: expected positive integers, got '{text}'")
    return vals


def _catalog(path: Path | None):  # -> Catalog (import kept local: light CLI start-up)
    from boute.catalog import builtin_catalog, load_catalog_file

    return load_catalog_file(path) if path is not None else builtin_catalog()


def _tier(text: str, flag: str):  # -> quality.Tier
    from backends.profile.quality import Tier

    name, sep, url = text.partition("=")
    if not sep or not name or not url.startswith(("http://", "https://")):
        raise BouteError(f"{flag}: expected NAME=URL (http...), got '{text}'")
    model = None
    if "@" in name:  # NAME@SERVED_MODEL=URL when the endpoint serves another model name
        name, model = name.split("@", 1)
    return Tier(name=name, url=url, model=model)


def register(app: typer.Typer) -> None:
    profile = typer.Typer(help="Profile live engines: performance (calibration) and answer quality.")
    app.add_typer(profile, name="profile")

    @profile.command("perf")
    def perf_cmd(
        endpoint: str = typer.Option(..., "--endpoint", help="OpenAI-compatible base URL, e.g. http://host:30000"),
        model: str = typer.Option(..., "--model", help="catalog model name (architecture) being served"),
        gpu: str = typer.Option(..., "--gpu", help="catalog GPU type the replica runs on"),
        served_model: str | None = typer.Option(
            None, "--served-model", help="model name in requests (default --model)"
        ),
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
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Load-sweep a live endpoint, fit efficiency factors for GPU type --gpu, write the calibration file."""
        from backends.profile.calibrate import Replica, compare, fit_sweep, measured_points, write_calibration
        from backends.profile.calibrate import write_results as save_results
        from backends.profile.loadgen import LoadPoint, run_sweep
        from boute.perf.calibration import apply_calibration, load_calibration

        if api not in ("chat", "completions"):
            raise BouteError(f"--api: expected chat or completions, got '{api}'")
        cat = _catalog(catalog)
        try:
            cat.gpu(gpu)
            cat.model(model)
        except KeyError as exc:
            raise BouteError(str(exc.args[0])) from None
        points = [
            LoadPoint(concurrency=c, input_len=i, output_len=o, requests=max(requests, c))
            for i in _ints(inputs, "input")
            for o in _ints(outputs, "output")
            for c in _ints(concurrency, "concurrency")
        ]
        if rates:
            try:
                rate_vals = [float(r) for r in rates.split(",") if r.strip()]
            except ValueError:
                raise BouteError(f"--rates: expected comma-separated numbers, got '{rates}'") from None
            base_in, base_out = _ints(inputs, "input")[0], _ints(outputs, "output")[0]
            points += [LoadPoint(1, base_in, base_out, requests, rate_rps=r) for r in rate_vals]
        swept = run_sweep(endpoint, served_model or model, points, api=api)  # type: ignore[arg-type]
        replica = Replica(model=model, gpu=gpu, tp=tp, pp=pp, dtype=dtype, max_batch=max_batch)
        mps = measured_points(swept, replica, source=f"boute profile perf {endpoint}")
        if not mps:
            errs = sorted({e for r in swept for e in r.errors})
            raise BouteError(f"{endpoint}: no successful measurements to fit ({'; '.join(errs)[:300]})")
        before = compare(mps, cat)
        fit = fit_sweep(mps, cat, gpu)
        write_calibration(out, fit)
        after = compare(mps, apply_calibration(cat, load_calibration(out)))
        raw = results or out.with_suffix(".results.json")
        meta = {"endpoint": endpoint, "model": model, "gpu": gpu, "tp": tp, "pp": pp, "dtype": dtype}
        save_results(raw, swept, {**meta, "tracking": "boute.tracking not used: raw results kept in this file"})
        summary = {
            "calibration": str(out),
            "results": str(raw),
            "efficiency": {k: round(float(v), 4) for k, v in fit.efficiency.model_dump(exclude_none=True).items()},
            "fitted": list(fit.fitted),
            "median_abs_error_pct_before": round(median(abs(r["error_pct"]) for r in before), 2),
            "median_abs_error_pct_after": round(median(abs(r["error_pct"]) for r in after), 2),
            "points": [
                {
                    "concurrency": s.point.concurrency,
                    "rate_rps": s.point.rate_rps,
                    "input_tokens": round(s.mean_input_tokens, 1),
                    "output_tokens": round(s.mean_output_tokens, 1),
                    "ttft_ms": round(s.ttft_ms_mean, 2),
                    "tpot_ms": round(s.tpot_ms_mean, 3),
                    "throughput_rps": round(s.throughput_rps, 3),
                    "failed": s.failed,
                }
                for s in swept
            ],
        }
        typer.echo(json.dumps(summary, indent=None if as_json else 2))

    @profile.command("quality")
    def quality_cmd(
        dataset: str = typer.Option("builtin:gsm8k-test", "--dataset", help="builtin:gsm8k-test or a JSONL file"),
        tier: list[str] = typer.Option(..., "--tier", help="NAME=URL (or NAME@SERVED_MODEL=URL), repeatable"),
        judge: str | None = typer.Option(None, "--judge", help="judge endpoint URL (or NAME@MODEL=URL)"),
        limit: int | None = typer.Option(None, "--limit", help="first N examples only"),
        max_tokens: int = typer.Option(512, "--max-tokens"),
        concurrency: int = typer.Option(4, "--concurrency"),
        instruction: str | None = typer.Option(None, "--instruction", help="text put before each question"),
        out: Path = typer.Option(..., "--out", help="quality profile to write (JSONL)"),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """Run a dataset through every tier, score answers (GSM8K checker or judge), write a JSONL profile."""
        from backends.profile.quality import GSM8K_INSTRUCTION, Tier, load_dataset, profile_quality

        if limit is not None and limit < 1:
            raise BouteError(f"--limit must be >= 1, got {limit}")
        tiers = [_tier(t, "--tier") for t in tier]
        judge_tier: Tier | None = None
        if judge is not None:
            judge_tier = _tier(judge, "--judge") if "=" in judge else Tier(name="judge", url=judge)
        examples = load_dataset(dataset, limit)
        summary = profile_quality(
            examples,
            tiers,
            out,
            judge=judge_tier,
            max_tokens=max_tokens,
            concurrency=concurrency,
            instruction=GSM8K_INSTRUCTION if instruction is None else instruction,
        )
        typer.echo(json.dumps(summary, indent=None if as_json else 2))
