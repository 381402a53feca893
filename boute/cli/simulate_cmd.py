"""``boute simulate``: run the event simulator on a plan and print latency, throughput and cost."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer


def _clean(obj: object) -> object:
    """JSON has no inf/nan: unfinished/undefined figures become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    return obj


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate_cmd(
        plan: Path = typer.Option(..., "--plan", "-p", help="plan JSON/YAML"),
        scenario: str | None = typer.Option(
            None, "--scenario", "-s", help="scenario YAML or builtin:NAME (default: the one the plan names)"
        ),
        rate: float | None = typer.Option(None, "--rate", min=1e-9, help="req/s (default: the scenario's)"),
        duration: float | None = typer.Option(None, "--duration", min=1e-9, help="seconds of arrivals"),
        seed: int | None = typer.Option(None, "--seed", min=0, help="workload and routing seed"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        calibration: Path | None = typer.Option(
            None, "--calibration", help="calibration file (e.g. from boute profile perf) instead of the scenario's"
        ),
    ) -> None:
        """Simulate a plan under the scenario's workload (approximate: the perf model is a calibrated roofline)."""
        from boute.serving.bundle import open_plan, plan_scenario
        from boute.sim import simulate
        from boute.specs import load_scenario
        from boute.specs.plan import check_plan_hardware
        from boute.workload import build_workload

        # a plan carries the scenario it was made for (older plans name it: builtin:NAME or a path);
        # --scenario overrides it
        p = open_plan(plan)
        own = plan_scenario(p, plan) if scenario is None else None
        sc = own or load_scenario(scenario if scenario is not None else p.scenario)
        if calibration is not None:
            from boute.perf import with_calibration

            sc = with_calibration(sc, calibration)
        check_plan_hardware(p, sc.catalog, plan)
        for i, g in enumerate(p.deployment):
            if g.tier not in {t.name for t in sc.tiers}:
                from boute.errors import SpecError

                raise SpecError(plan, f"deployment[{i}].tier", f"'{g.tier}' is not a tier of scenario '{sc.name}'")
        s = sc.workload.seed if seed is None else seed
        wl = build_workload(sc, rate_rps=rate, duration_s=duration, seed=s)
        res = simulate(p, sc, wl, seed=s)
        summary = res.summary()
        gpus = p.gpus_used()
        summary.update(
            scenario=sc.name,
            plan=str(plan),
            rate_rps=wl.rate_rps,
            duration_s=wl.duration_s,
            seed=s,
            within_budget=summary["cost_per_hour"] <= sc.cluster.budget_per_hour + 1e-9,
            within_inventory=all(n <= sc.cluster.gpus.get(g, 0) for g, n in gpus.items()),
            gpus_used=gpus,
        )
        if as_json:
            typer.echo(json.dumps(_clean(summary)))
            return
        keys = (
            "requests",
            "completed",
            "p50_latency_s",
            "p95_latency_s",
            "p99_latency_s",
            "mean_latency_s",
            "p50_ttft_s",
            "p95_ttft_s",
            "cached_token_share",
            "throughput_rps",
            "slo_attainment",
            "cost_per_hour",
            "within_budget",
        )
        for k in keys:
            v = summary[k]
            if v is None:  # cached_token_share: the workload's prompts share no prefixes
                continue
            typer.echo(f"{k:>16}: {v:.4g}" if isinstance(v, float) else f"{k:>16}: {v}")
        if summary["affinity_routed"] is not None:  # the plan balances by prefix affinity: why requests went where
            typer.echo(
                f"{'affinity_routed':>16}: " + ", ".join(f"{k} {v}" for k, v in summary["affinity_routed"].items())
            )
