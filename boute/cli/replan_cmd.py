"""``boute replan``: the autopilot of a running deployment; ``boute status``: what it sees beside the promise."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from boute.cli.options import DEPLOY_DIR, deployment_dir, positive
from boute.errors import BouteError


def replan_cmd(
    directory: Path | None = DEPLOY_DIR,
    db: str = typer.Option("sqlite:///boute.db", "--db", help="tracking DB: warm start and the decisions"),
    interval: float = typer.Option(10.0, "--interval", callback=positive, help="seconds between checks"),
    window: float = typer.Option(60.0, "--window", callback=positive, help="seconds of traffic each check judges"),
    max_evals: int = typer.Option(30, "--max-evals", min=1, help="new evaluations per re-plan (after warm ones)"),
    warm_from: list[str] = typer.Option(
        [], "--warm-from", help="experiment(s) whose trials seed the first re-plan (default: none)"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="propose plans, never roll them out"),
    duration: float | None = typer.Option(
        None, "--duration", callback=positive, help="stop after this many seconds (default: run until Ctrl-C)"
    ),
    rate_up: float = typer.Option(
        0.15, "--rate-up", callback=positive, help="re-plan when the rate is this much above the plan's"
    ),
    sustain: int = typer.Option(3, "--sustain", min=1, help="checks a condition must hold before it fires"),
    cooldown: float = typer.Option(
        180.0, "--cooldown", min=0, help="seconds after a re-plan when only lost capacity fires"
    ),
    min_requests: int = typer.Option(300, "--min-requests", min=1, help="a window with fewer judges only capacity"),
) -> None:
    """Watch the deployment's traffic (all its gateways, through Redis); when it leaves the plan behind
    (rate, length or difficulty mix, P95, lost replicas), re-optimise warm-started from the tracking DB
    and roll the new plan out. Each trigger and re-plan is printed with its evidence and recorded."""
    from boute.cli.deploy_cmd import roll_out
    from boute.cli.signals import stop_signals
    from boute.replan.drift import Thresholds
    from boute.replan.loop import Autopilot

    d = deployment_dir(directory)

    def live(plan: Path) -> None:
        roll_out(plan, d)  # a rolling update of the running deployment, on the target it runs on

    th = Thresholds(rate_up=rate_up, sustain=sustain, cooldown_s=cooldown, min_requests=min_requests)
    pilot = Autopilot(
        d,
        db=db,
        thresholds=th,
        window_s=window,
        max_evals=max_evals,
        dry_run=dry_run,
        warm_from=list(warm_from),
        say=lambda line: typer.echo(f"{time.strftime('%H:%M:%S')} {line}", err=False),
        roll_out=live,
    )
    typer.echo(
        f"watching {pilot.dir} every {interval:g} s over {window:g} s windows ({'dry run' if dry_run else 'autopilot'})"
    )
    end = None if duration is None else time.monotonic() + duration
    try:
        with pilot, stop_signals():  # Ctrl-C or SIGTERM stops the watch, however the command was started
            while end is None or time.monotonic() < end:
                try:
                    pilot.step()
                except BouteError as exc:  # Redis away, a broken observation: say so and keep watching
                    typer.echo(f"{time.strftime('%H:%M:%S')} check failed: {exc}", err=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        typer.echo("stopped")


def status_cmd(
    directory: Path | None = DEPLOY_DIR,
    window: float = typer.Option(60.0, "--window", callback=positive, help="seconds of traffic to summarise"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """What the deployment's gateways served over the last window, beside the plan's promise."""
    from boute.replan.drift import Thresholds
    from boute.replan.loop import Autopilot, json_safe

    pilot = Autopilot(
        deployment_dir(directory), db="sqlite://", thresholds=Thresholds(), window_s=window, max_evals=1,
        dry_run=True, warm_from=[], say=lambda _: None,
    )  # fmt: skip
    w = pilot.window()
    p, plan = pilot.detector.promise, pilot.plan
    promised_shares = (
        plan.predicted.tier_shares if plan.predicted and plan.predicted.tier_shares else plan.routing.fractions
    )
    served = sum(w.tier_served.values()) or 1
    doc = {
        "observed": json_safe(w.summary()),
        "promise": {
            "rate_rps": p.rate_rps,
            "p95_s": p.p95_s,
            "tier_shares": dict(zip(plan.routing.tiers, promised_shares or [], strict=False)),
            "groups": p.groups,
        },
        "served_shares": {t: n / served for t, n in w.tier_served.items()},
    }
    if as_json:
        typer.echo(json.dumps(doc))
        return
    o = doc["observed"]
    typer.echo(f"window {o['span_s']:.0f} s, {o['requests']} requests from {o['instances']} gateway(s)")
    typer.echo(f"{'':<22}{'promised':>12}{'observed':>12}")
    typer.echo(f"{'rate (req/s)':<22}{p.rate_rps:>12.4g}{w.rate_rps:>12.4g}")
    typer.echo(f"{'P95 (s)':<22}{(p.p95_s or float('nan')):>12.4g}{w.p95_s:>12.4g}")
    for t in plan.routing.tiers:
        promised = doc["promise"]["tier_shares"].get(t, float("nan"))
        typer.echo(f"{'share ' + t:<22}{promised:>12.4g}{doc['served_shares'].get(t, 0.0):>12.4g}")
    for g, n in p.groups.items():
        typer.echo(f"{g:<22}{n:>12d}{w.healthy.get(g, 0):>12d}  (replicas deployed / healthy)")


def register(app: typer.Typer) -> None:
    app.command("replan")(replan_cmd)
    app.command("status")(status_cmd)
