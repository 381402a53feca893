"""``boute validate``: check scenario and plan files without running anything."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("validate")
    def validate_cmd(
        scenario: Path | None = typer.Option(None, "--scenario", "-s", help="scenario YAML (default: built-in)"),
        plan: Path | None = typer.Option(None, "--plan", "-p", help="plan JSON/YAML to check against it"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    ) -> None:
        """Validate a scenario and/or a plan (with its bundle); exit 2 with a one-line error if invalid.

        A plan alone is checked against the scenario it carries; with --scenario, against that one."""
        from boute.serving.bundle import open_plan, plan_scenario
        from boute.specs import load_scenario
        from boute.specs.plan import check_plan_hardware

        p = open_plan(plan) if plan is not None else None
        own = plan_scenario(p, plan) if p is not None and plan is not None and scenario is None else None
        sc = own or load_scenario(scenario)
        summary: dict[str, object] = {
            "scenario": sc.name,
            "tiers": [t.model for t in sc.tiers],
            "gpus": dict(sc.cluster.gpus),
            "budget_per_hour": sc.cluster.budget_per_hour,
        }
        if p is not None:
            check_plan_hardware(p, sc.catalog, plan)
            from boute.sim.engine import plan_cost  # only where a plan is validated: keeps the bare command light

            summary["plan_cost_per_hour"] = round(plan_cost(p.deployment, sc), 4)
            summary["plan_gpus"] = p.gpus_used()
            summary["plan_scorer"] = p.routing.model_dump(include={"scorer"})["scorer"]  # as the plan spells it
            summary["plan_artifacts"] = len(p.artifacts)
        if as_json:
            typer.echo(json.dumps(summary))
            return
        for k, v in summary.items():
            typer.echo(f"{k}: {v}")
        typer.echo("valid")
