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
        as_json: bool = typer.Option(False, "--json", help="print a JSON summary"),
    ) -> None:
        """Validate a scenario (and optionally a plan); exit 2 with a one-line error if invalid."""
        from boute.specs import load_plan, load_scenario

        sc = load_scenario(scenario)
        summary: dict[str, object] = {
            "scenario": sc.name,
            "tiers": [t.model for t in sc.tiers],
            "gpus": dict(sc.cluster.gpus),
            "budget_per_hour": sc.cluster.budget_per_hour,
        }
        if plan is not None:
            p = load_plan(plan, sc.catalog)
            summary["plan_cost_per_hour"] = round(sum(sc.price(g.gpu) * g.gpus_used for g in p.deployment), 4)
            summary["plan_gpus"] = p.gpus_used()
        typer.echo(json.dumps(summary, indent=None if as_json else 2))
