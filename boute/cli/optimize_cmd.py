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
from typing import TYPE_CHECKING, Any

import typer

from boute.cli.options import REPORT, TRACKING_DB
from boute.optimize.objectives import tie_key
from boute.optimize.registry import EVALUATORS, STRATEGIES
from boute.optimize.settings import default_of, help_of, option_decl
from boute.optimize.status import TrialStatus
from boute.serving.registry import DEFAULT_REDIS_URL

if TYPE_CHECKING:  # annotations only: the CLI imports the optimiser when the command runs
    from rich.progress import Progress, TaskID

    from boute.optimize.evaluators.base import EvalDetail
    from boute.optimize.outcome import Outcome
    from boute.optimize.plan_run import PlanRequest, PlanRun
    from boute.optimize.trials import Trial


def _opt(name: str, *aliases: str, help: str | None = None, **kw: Any) -> Any:
    """The option of the search setting ``name``: its default, flag and help from
    :class:`~boute.optimize.settings.SearchSettings` (``help`` added after the field's own)."""
    return typer.Option(default_of(name), option_decl(name), *aliases, help=help_of(name) + (help or ""), **kw)


# the module is imported by the CLI's root after the plug-ins registered (the live evaluator): the choices
# listed here include them
STRATEGY = _opt("strategy", help=STRATEGIES.choices())
EVALUATOR = _opt("evaluator", help=EVALUATORS.choices())
MAX_EVALS = _opt("max_evals", min=1)
OBJECTIVE = _opt("objective")
PREFER = _opt("prefer")
SCREEN = _opt("screen")
BATCH = _opt("batch", min=1)
WORKERS = _opt("workers", min=1)
RAY_ADDRESS = _opt("ray_address")
TIME_BUDGET = _opt("time_budget_s", min=1.0)
OVERLAP = _opt("overlap")
MODE = _opt("mode")
SEED = _opt("seed")
EXPERIMENT = _opt("experiment")
PATIENCE = _opt("patience", min=0)
CONFIRM = _opt("confirm")
CONFIRM_WITH = _opt("confirm_with", help=EVALUATORS.choices())
MAX_CONFIRM = _opt("max_confirm", min=1)

OUT = typer.Option(..., "--out", "-o", help="plan file to write (JSON or YAML)")
SCENARIO = typer.Option(None, "--scenario", "-s", help="scenario YAML or builtin:NAME")
BUDGET = typer.Option(None, "--budget", help="USD/h budget (overrides the scenario)")
QUALITY_FLOOR = typer.Option(None, "--quality-floor", help="minimum quality in [0,1]")
P95_CAP = typer.Option(None, "--p95-cap", help="P95 end-to-end latency cap, seconds")
QUALITY_CONFIDENCE = typer.Option(
    None,
    "--quality-confidence",
    help="hold the quality floor on the one-sided lower confidence bound at this level (e.g. 0.95) "
    "of the held-out quality, not on its mean",
)
JUDGE = typer.Option(
    None,
    "--judge",
    help="cascade: cut thresholds on the offline verifier's scores or on the LLM judge's the profile "
    "recorded (verifier | llm; default: the scenario's quality.judge)",
)
ROUTER = typer.Option(
    None,
    "--router",
    help="pre-route: 'ladder' (a difficulty score cut by thresholds) or 'multi' (each tier's predicted "
    "correctness, priced to the load fractions) (default: the scenario's quality.router_kind)",
)
AFFINITY = typer.Option(
    None,
    "--affinity/--no-affinity",
    help="judge plans under prefix-affinity balancing (the gateway's cache-aware rule, default settings), or "
    "under least load, and write it into the plan (default: the scenario's balancing)",
)
PLOT = typer.Option(None, "--plot", help="write a Pareto plot (PNG)")
QUIET = typer.Option(False, "--quiet", "-q", help="no progress bar")
CALIBRATION = typer.Option(
    None, "--calibration", help="calibration file (e.g. from boute profile perf) instead of the scenario's"
)
REDIS = typer.Option(
    DEFAULT_REDIS_URL,
    "--redis",
    envvar="BOUTE_REDIS_URL",
    help="Redis for the live evaluator's replica registry (--evaluator live only)",
)


def register(app: typer.Typer) -> None:
    app.command("optimize")(optimize_cmd)


def optimize_cmd(
    out: Path = OUT,
    scenario: str | None = SCENARIO,
    budget: float | None = BUDGET,
    quality_floor: float | None = QUALITY_FLOOR,
    p95_cap: float | None = P95_CAP,
    quality_confidence: float | None = QUALITY_CONFIDENCE,
    max_evals: int = MAX_EVALS,
    objective: str = OBJECTIVE,
    prefer: str | None = PREFER,
    screen: bool = SCREEN,
    strategy: str = STRATEGY,
    evaluator: str = EVALUATOR,
    batch: int = BATCH,
    workers: int | None = WORKERS,
    ray_address: str | None = RAY_ADDRESS,
    time_budget: float | None = TIME_BUDGET,
    overlap: bool = OVERLAP,
    mode: str = MODE,
    judge: str | None = JUDGE,
    router: str | None = ROUTER,
    affinity: bool | None = AFFINITY,
    seed: int = SEED,
    db: str | None = TRACKING_DB,
    experiment: str | None = EXPERIMENT,
    patience: int = PATIENCE,
    confirm: bool = CONFIRM,
    confirm_with: str = CONFIRM_WITH,
    max_confirm: int = MAX_CONFIRM,
    plot: Path | None = PLOT,
    report: Path | None = REPORT,
    quiet: bool = QUIET,
    calibration: Path | None = CALIBRATION,
    redis: str = REDIS,
) -> None:
    """Find the best plan (--objective: lowest P95, lowest $/h, or a pick of the quality x P95 x $/h front)
    meeting the quality floor and the P95 cap within the budget."""
    from boute.optimize.plan_run import PlanRequest
    from boute.optimize.settings import SearchSettings
    from boute.specs.balancing import Affinity

    # a bad option is one line before the optimiser's imports: the request checks itself when it is made
    search = SearchSettings(
        strategy=strategy,
        evaluator=evaluator,
        max_evals=max_evals,
        objective=objective,
        prefer=prefer,
        screen=screen,
        batch=batch,
        workers=workers,
        ray_address=ray_address,
        time_budget_s=time_budget,
        overlap=overlap,
        mode=mode,
        seed=seed,
        experiment=experiment,
        patience=patience,
        confirm=confirm,
        confirm_with=confirm_with,
        max_confirm=max_confirm,
    )
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
        db=db,
        plot=plot,
        redis_url=redis,
        search=search,
        affinity=None if affinity is None else Affinity(enabled=affinity),
    )
    run = _run(req, quiet)
    if report is not None:
        from boute.report.publish import write_report

        typer.echo(f"  report: {write_report(db, run.summary.experiment, report)}")


def _run(req: PlanRequest, quiet: bool) -> PlanRun:
    """Make the plan with a progress bar (which goes before anything else is said), then say what was done."""
    from boute.optimize.plan_run import make_plan, prepare_search_process

    prepare_search_process()  # this process runs the search, set up as a worker would be
    progress = _Progress(req.search.max_evals, quiet, req.search.objective)

    def searched(res: Outcome) -> None:
        progress.__exit__()  # the bar goes before anything else is said
        if res.resumed_trials:
            typer.echo(f"resumed experiment '{res.experiment_name}' from {res.resumed_trials} stored trials", err=True)

    with progress:
        run = make_plan(req, on_trial=progress.update, on_searched=searched, clock=progress.clock)
    _summary(run)
    return run


class _Progress:
    """Rich progress bar on stderr with the current best feasible plan, when the first one came, and where the
    search's time has gone so far (:mod:`boute.optimize.clock`: setup, propose, screen, evaluate, record)."""

    def __init__(self, total: int, quiet: bool, objective: str = "latency") -> None:
        from boute.optimize.clock import SearchClock

        self.clock = SearchClock()
        self.quiet = quiet
        self.total = total
        self.objective = objective
        self._p: Progress | None = None
        self._task: TaskID | None = None
        self._best: tuple[tuple[float, ...], float, float] | None = None  # (key, P95, $/h) of the best
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
        if trial.status == TrialStatus.SCREENED:
            self._screened += 1
        else:
            self._done += 1
        r = trial.result
        if r is not None and r.feasible:  # the best feasible plan on the objective's axis (P95 unless cost)
            key = tie_key(
                "cost" if self.objective == "cost" else "latency", r.quality, r.p95_latency_s, r.cost_per_hour
            )
            if self._best is None or key < self._best[0]:
                self._best = (key, r.p95_latency_s, r.cost_per_hour)
        if self._best is None:
            desc = "best: none feasible yet"
        elif self.objective == "cost":
            desc = f"best: ${self._best[2]:.2f}/h, P95 {self._best[1]:.3g} s"
        else:
            desc = f"best P95: {self._best[1]:.3g} s (${self._best[2]:.2f}/h)"
        first = self.clock.marks.get("first_feasible")
        if first is not None:
            desc += f", first feasible at {first.seconds:.1f} s"
        if self._screened:
            desc += f"; {self._screened} screened out"
        from boute.optimize.clock import breakdown

        phases = breakdown(self.clock.seconds, detail=False, beside=self.clock.beside)
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
        s, pl = out.screen.search, out.screen.pool
        typer.echo(
            f"  screens: of {s.seen} proposals, {s.projected} moved onto the quality floor, "
            f"{s.quality} below it, {s.capacity} over the capacity bound (not evaluated); "
            f"acquisition pool: {pl.projected} of {pl.seen} moved, {pl.quality + pl.capacity} removed"
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

    typer.echo(f"  time: {breakdown(out.phase_s, wall_s=run.wall_s, beside=out.beside_s)}")
    first = out.first_feasible
    if first is not None:
        typer.echo(
            f"  first plan meeting the targets: {first.seconds:.1f} s into the run, after {first.evaluations} "
            + ("evaluation" if first.evaluations == 1 else "evaluations")
        )
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
