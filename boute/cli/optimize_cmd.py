"""``boute optimize``: co-optimise routing and heterogeneous deployment, write the plan.

Argument parsing and printing only: the run is :func:`boute.optimize.plan_run.make_plan`, the entry point
the re-plan loop calls too.

Trials are recorded in the tracking database as they finish; rerunning the same command (or naming the
same ``--experiment``) resumes from them. Infeasible targets give one line and exit code 2, and so does a
search whose every plan the confirming evaluator rejects: a plan is only written once it is confirmed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from boute.cli.options import TRACKING_DB
from boute.optimize.registry import EVALUATORS, OBJECTIVES, PREFERENCES, STRATEGIES
from boute.serving.registry import DEFAULT_REDIS_URL

if TYPE_CHECKING:  # annotations only: the CLI imports the optimiser when the command runs
    from rich.progress import Progress, TaskID

    from boute.optimize.evaluators.base import EvalDetail
    from boute.optimize.outcome import Outcome
    from boute.optimize.plan_run import PlanRun
    from boute.optimize.trials import Trial


def register(app: typer.Typer) -> None:
    @app.command("optimize")
    def optimize_cmd(
        out: Path = typer.Option(..., "--out", "-o", help="plan file to write (JSON or YAML)"),
        scenario: str | None = typer.Option(None, "--scenario", "-s", help="scenario YAML or builtin:NAME"),
        budget: float | None = typer.Option(None, "--budget", help="USD/h budget (overrides the scenario)"),
        quality_floor: float | None = typer.Option(None, "--quality-floor", help="minimum quality in [0,1]"),
        p95_cap: float | None = typer.Option(None, "--p95-cap", help="P95 end-to-end latency cap, seconds"),
        quality_confidence: float | None = typer.Option(
            None,
            "--quality-confidence",
            help="hold the quality floor on the one-sided lower confidence bound at this level (e.g. 0.95) "
            "of the held-out quality, not on its mean",
        ),
        max_evals: int = typer.Option(60, "--max-evals", min=1, help="evaluation budget"),
        objective: str = typer.Option(
            "latency", "--objective", help="what to optimise among plans meeting the targets: " + OBJECTIVES.choices()
        ),
        prefer: str | None = typer.Option(
            None,
            "--prefer",
            help="--objective pareto: the rule picking the plan from the front (default knee): "
            + PREFERENCES.choices(),
        ),
        screen: bool = typer.Option(
            True,
            "--screen/--no-screen",
            help="move proposals onto the quality floor and skip plans over the capacity bound before evaluating",
        ),
        strategy: str = typer.Option("mobo", "--strategy", help=STRATEGIES.choices()),
        evaluator: str = typer.Option(
            "sim",
            "--evaluator",
            help="what the search optimises (the simulator by default, with the fast path as the GP's prior): "
            + EVALUATORS.choices(),
        ),
        batch: int = typer.Option(4, "--batch", min=1, help="proposals per search step, evaluated together"),
        workers: int | None = typer.Option(
            None,
            "--workers",
            min=1,
            help="processes evaluating a batch (default: the cores this process may use; with --ray-address, "
            "the cluster's CPUs)",
        ),
        ray_address: str | None = typer.Option(
            None,
            "--ray-address",
            help="evaluate batches on this Ray cluster's actors (auto, HOST:PORT or ray://HOST:10001; every node "
            "needs BOute installed); raise --batch with its size",
        ),
        time_budget: float | None = typer.Option(
            None, "--time-budget", min=1.0, help="stop searching after this many seconds (the plan is still confirmed)"
        ),
        mode: str = typer.Option("preroute", "--mode", help="routing mode: preroute | cascade"),
        judge: str | None = typer.Option(
            None,
            "--judge",
            help="cascade: cut thresholds on the offline verifier's scores or on the LLM judge's the profile "
            "recorded (verifier | llm; default: the scenario's quality.judge)",
        ),
        router: str | None = typer.Option(
            None,
            "--router",
            help="pre-route: 'ladder' (a difficulty score cut by thresholds) or 'multi' (each tier's predicted "
            "correctness, priced to the load fractions) (default: the scenario's quality.router_kind)",
        ),
        seed: int = typer.Option(
            0,
            "--seed",
            help="the search's seed (where it looks); the simulated traffic is the scenario's workload.seed",
        ),
        db: str | None = TRACKING_DB,
        experiment: str | None = typer.Option(None, "--experiment", help="experiment name; an existing one resumes"),
        patience: int = typer.Option(
            20, "--patience", min=0, help="stop when the chosen plan is unchanged this long (0: never)"
        ),
        confirm: bool = typer.Option(True, "--confirm/--no-confirm", help="re-evaluate the best front points"),
        confirm_with: str = typer.Option(
            "sim", "--confirm-with", help="a more faithful evaluator than --evaluator: " + EVALUATORS.choices()
        ),
        max_confirm: int = typer.Option(
            12,
            "--max-confirm",
            min=1,
            help="confirming evaluations in all: the best 4 plans, then a search with the confirming evaluator",
        ),
        plot: Path | None = typer.Option(None, "--plot", help="write a Pareto plot (PNG)"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
        calibration: Path | None = typer.Option(
            None, "--calibration", help="calibration file (e.g. from boute profile perf) instead of the scenario's"
        ),
        redis: str = typer.Option(
            DEFAULT_REDIS_URL,
            "--redis",
            envvar="BOUTE_REDIS_URL",
            help="Redis for the live evaluator's replica registry (--evaluator live only)",
        ),
    ) -> None:
        """Find the best plan (--objective: lowest P95, lowest $/h, or a pick of the quality x P95 x $/h front)
        meeting the quality floor and the P95 cap within the budget."""
        from boute.optimize.plan_run import PlanRequest, make_plan, prepare_search_process

        req = PlanRequest(
            out=out,
            scenario=scenario,
            budget=budget,
            quality_floor=quality_floor,
            p95_cap=p95_cap,
            quality_confidence=quality_confidence,
            judge=judge,
            router=router,
            calibration=calibration,
            max_evals=max_evals,
            objective=objective,
            prefer=prefer,
            screen=screen,
            strategy=strategy,
            evaluator=evaluator,
            batch=batch,
            workers=workers,
            ray_address=ray_address,
            time_budget_s=time_budget,
            mode=mode,
            seed=seed,
            db=db,
            experiment=experiment,
            patience=patience or None,
            confirm=confirm,
            confirm_with=confirm_with,
            max_confirm=max_confirm,
            plot=plot,
            redis_url=redis,
        )
        req.check()  # a bad option is one line before the optimiser's imports
        prepare_search_process()  # this process runs the search, set up as a worker would be
        progress = _Progress(max_evals, quiet, objective)

        def searched(res: Outcome) -> None:
            progress.__exit__()  # the bar goes before anything else is said
            if res.resumed_trials:
                typer.echo(
                    f"resumed experiment '{res.experiment_name}' from {res.resumed_trials} stored trials", err=True
                )

        with progress:
            run = make_plan(req, on_trial=progress.update, on_searched=searched, clock=progress.clock)
        _summary(run)


class _Progress:
    """Rich progress bar on stderr with the current best feasible plan and where the search's time has gone
    so far (:mod:`boute.optimize.clock`: setup, propose, screen, evaluate, record)."""

    def __init__(self, total: int, quiet: bool, objective: str = "latency") -> None:
        from boute.optimize.clock import SearchClock

        self.clock = SearchClock()
        self.quiet = quiet
        self.total = total
        self.objective = objective
        self._p: Progress | None = None
        self._task: TaskID | None = None
        self._best: tuple[float, float] | None = None
        self._done: int | None = None  # evaluated trials, counted from the resumed ones on the first update
        self._screened = 0

    def __enter__(self) -> _Progress:
        if not self.quiet:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._p = Progress(
                TextColumn("optimizing"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                TextColumn("[dim]{task.fields[phases]}"),
                console=Console(stderr=True),
                transient=True,
            )
            self._p.__enter__()
            self._task = self._p.add_task("best: none feasible yet", total=self.total, phases="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:  # idempotent: the bar goes when the search ends, before the confirmation
            self._p.__exit__(None, None, None)
            self._p = None

    def update(self, trial: Trial, trials: Sequence[Trial]) -> None:
        """One trial finished: evaluated ones advance the bar, screened ones only the count beside it.
        ``trials``: the experiment's trials before this search (a resumed experiment's stored ones)."""
        if self._p is None or self._task is None:
            return
        if self._done is None:
            self._done = sum(t.evaluated for t in trials)
        if trial.status == "screened":
            self._screened += 1
        else:
            self._done += 1
        r = trial.result
        if r is not None and r.feasible:
            key = (r.cost_per_hour, r.p95_latency_s) if self.objective == "cost" else (r.p95_latency_s, r.cost_per_hour)
            if self._best is None or key < self._best:
                self._best = key
        if self._best is None:
            desc = "best: none feasible yet"
        elif self.objective == "cost":
            desc = f"best: ${self._best[0]:.2f}/h, P95 {self._best[1]:.3g} s"
        else:
            desc = f"best P95: {self._best[0]:.3g} s (${self._best[1]:.2f}/h)"
        if self._screened:
            desc += f"; {self._screened} screened out"
        from boute.optimize.clock import breakdown

        phases = breakdown(self.clock.seconds, detail=False)
        self._p.update(self._task, completed=self._done, description=desc, phases=phases)


def _summary(run: PlanRun) -> None:
    out, plan = run.summary, run.plan
    p = plan.predicted
    typer.echo(
        f"plan written ({out.objective}): {out.evaluations} evaluations ({out.resumed_trials} resumed)"
        + (f" + {out.confirmations} confirmations" if out.confirmations else "")
        + (f" ({out.confirm_searched} by a search with the confirming evaluator)" if out.confirm_searched else "")
        + f", {run.wall_s:.1f} s; "
        f"experiment '{out.experiment}'"
    )
    if out.screen is not None:
        s, pl = out.screen["search"], out.screen["pool"]
        typer.echo(
            f"  screens: of {s['seen']} proposals, {s['projected']} moved onto the quality floor, "
            f"{s['quality']} below it, {s['capacity']} over the capacity bound (not evaluated); "
            f"acquisition pool: {pl['projected']} of {pl['seen']} moved, {pl['quality'] + pl['capacity']} removed"
        )
    r = out.searched
    if r is not None:
        typer.echo(
            f"  {r.evaluator}: quality {_quality(r.quality, r.extra)}, P95 {r.p95_latency_s:.3g} s, "
            f"{r.throughput_rps:.1f} req/s, ${r.cost_per_hour:.2f}/h"
        )
    if p is not None and p.evaluator != (r.evaluator if r is not None else None):
        typer.echo(
            f"  {p.evaluator} (confirmed): quality {p.quality:.4f}, P95 {p.p95_latency_s:.3g} s, "
            f"{p.throughput_rps:.1f} req/s, meets targets: {p.feasible}"
        )
    from boute.optimize.clock import breakdown

    typer.echo(f"  time: {breakdown(out.phase_s, wall_s=run.wall_s)}")
    fr = ", ".join(f"{t}={f:.3f}" for t, f in zip(plan.routing.tiers, plan.routing.fractions or [], strict=False))
    typer.echo(f"  routing ({plan.routing.mode}): {fr}")
    for g in plan.deployment:
        typer.echo(f"  {g.tier}: {g.count} x {g.model} on {g.gpu} (tp={g.tp}, pp={g.pp})")


def _quality(quality: float, extra: EvalDetail) -> str:
    """The held-out mean with its lower confidence bound, where the quality model states one."""
    q = extra.quality or {}
    if q.get("mean") is None or q.get("bound") is None:
        return f"{quality:.4f}"
    return f"{q['mean']:.4f} ({q['level']:.0%} lower bound {q['bound']:.4f}, se {q['se']:.4f})"
