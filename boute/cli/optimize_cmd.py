"""``boute optimize``: co-optimise routing and heterogeneous deployment, write the plan.

Trials are recorded in the tracking database as they finish; rerunning the same command (or naming the
same ``--experiment``) resumes from them. Infeasible targets give one line and exit code 2, and so does a
search whose every plan the confirming evaluator rejects: a plan is only written once it is confirmed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from boute.optimize.registry import EVALUATORS, OBJECTIVES, PREFERENCES, STRATEGIES

if TYPE_CHECKING:  # annotations only: the CLI imports the optimiser when the command runs
    from rich.progress import Progress, TaskID

    from boute.optimize.result import Trial
    from boute.optimize.session import Outcome
    from boute.specs import Plan


def register(app: typer.Typer) -> None:
    @app.command("optimize")
    def optimize_cmd(
        out: Path = typer.Option(..., "--out", "-o", help="plan file to write (JSON or YAML)"),
        scenario: str | None = typer.Option(None, "--scenario", "-s", help="scenario YAML or builtin:NAME"),
        budget: float | None = typer.Option(None, "--budget", help="USD/h budget (overrides the scenario)"),
        quality_floor: float | None = typer.Option(None, "--quality-floor", help="minimum quality in [0,1]"),
        p95_cap: float | None = typer.Option(None, "--p95-cap", help="P95 end-to-end latency cap, seconds"),
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
            None, "--workers", min=1, help="processes evaluating a batch (default: the cores this process may use)"
        ),
        time_budget: float | None = typer.Option(
            None, "--time-budget", min=1.0, help="stop searching after this many seconds (the plan is still confirmed)"
        ),
        mode: str = typer.Option("preroute", "--mode", help="routing mode: preroute | cascade"),
        seed: int = typer.Option(0, "--seed", help="random seed"),
        db: str | None = typer.Option(None, "--db", help="tracking DB URL (default sqlite:///boute.db)"),
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
            "redis://127.0.0.1:6379/0",
            "--redis",
            envvar="BOUTE_REDIS_URL",
            help="Redis for the live evaluator's replica registry (--evaluator live only)",
        ),
    ) -> None:
        """Find the best plan (--objective: lowest P95, lowest $/h, or a pick of the quality x P95 x $/h front)
        meeting the quality floor and the P95 cap within the budget."""
        import warnings

        import torch
        from linear_operator.utils.warnings import NumericalWarning

        from boute.errors import BouteError, InfeasibleError
        from boute.optimize import session
        from boute.optimize.evaluators import make_evaluator, router_of
        from boute.optimize.parallel import default_workers
        from boute.quality import quality_model_for
        from boute.quality.router import router_files
        from boute.serving.bundle import write_plan
        from boute.specs import load_scenario
        from boute.tracking import open_store

        torch.set_num_threads(2)
        # GPyTorch adds jitter to near-singular kernel matrices and says so; that is handled, not news to a user
        warnings.filterwarnings("ignore", category=NumericalWarning)
        STRATEGIES.get(strategy)
        OBJECTIVES.get(objective)
        if prefer is not None:
            PREFERENCES.get(prefer)
            if objective != "pareto":
                raise BouteError(
                    f"--prefer: picks a plan from the pareto front; it needs --objective pareto, not {objective}"
                )
        searching, confirming = EVALUATORS.get(evaluator), EVALUATORS.get(confirm_with, "--confirm-with")
        if mode not in ("preroute", "cascade"):
            raise BouteError(f"--mode: unknown routing mode '{mode}' (known: preroute, cascade)")
        if quality_floor is not None and not 0 <= quality_floor <= 1:
            raise BouteError(f"--quality-floor: {quality_floor} is not in [0, 1]")
        for opt, v in (("--budget", budget), ("--p95-cap", p95_cap)):
            if v is not None and v <= 0:
                raise BouteError(f"{opt}: must be > 0, got {v}")
        t0 = time.perf_counter()
        sc = session.with_targets(load_scenario(scenario), budget, quality_floor, p95_cap)
        if calibration is not None:
            from boute.perf import with_calibration

            sc = with_calibration(sc, calibration)
        store = open_store(db)
        progress = _Progress(max_evals, quiet, objective)
        ev = None
        try:
            # the live evaluator owns a gateway and replica processes: closed on every exit, Ctrl-C included
            ev = make_evaluator(evaluator, sc, mode, seed, redis_url=redis)
            # the plan routes with the scenario's learned router (a live search measures quality instead)
            quality_model = ev.quality_model or quality_model_for(sc)
            # the fast path as the prior a simulator (or live) search corrects: cheap, and right in shape
            fast = (
                make_evaluator("fast", sc, mode, seed, quality_model=ev.quality_model)
                if searching.fidelity > 0 and ev.quality_model is not None
                else None
            )
            with progress:
                res = session.optimize(
                    sc,
                    strategy=strategy,
                    evaluator=ev,
                    max_evals=max_evals,
                    seed=seed,
                    mode=mode,
                    patience=patience or None,
                    store=store,
                    experiment=experiment,
                    on_trial=progress.update,
                    objective=objective,
                    prefer=prefer,
                    screen=screen,
                    prior=fast,
                    batch=batch,
                    workers=default_workers() if workers is None else workers,
                    time_budget_s=time_budget,
                )
            searcher = ev
            ev.close()  # replicas of a live search are not needed to confirm or write the plan
            if res.resumed_trials:
                typer.echo(
                    f"resumed experiment '{res.experiment_name}' from {res.resumed_trials} stored trials", err=True
                )
            if res.chosen is None:
                _plot(res, plot)
                raise InfeasibleError(res.infeasible_message())
            if confirm and confirming.fidelity > searching.fidelity:  # confirmations only move up
                checker = make_evaluator(confirm_with, sc, mode, seed, quality_model=ev.quality_model, redis_url=redis)
                ev = checker  # closed by the finally below, whatever happens while confirming
                # a cheap search evaluator (the fast path) is the prior whose error a continued search learns
                prior = searcher if searching.fidelity == 0 else None
                session.confirm(res, checker, store=store, max_evals=max_confirm, seed=seed, prior=prior)
                checker.close()
            elif confirm and res.chosen.result is not None:  # the search's evaluator is already as faithful
                res.confirmed[res.chosen.index] = res.chosen.result
            _plot(res, plot)
            final = res.final
            if final is None:  # the confirming evaluator rejected every plan it checked: write nothing
                raise InfeasibleError(res.unconfirmed_message())
            router = router_of(quality_model)
            plan = session.build_plan(sc, res, mode, router)
            # self-contained: the router, the scenario and its files travel with the plan (a bundle beside it)
            write_plan(plan, out, sc, router_files(router) if router else ())
            assert res.experiment_id is not None  # a search with a store always records its experiment
            store.add_plan(
                res.experiment_id,
                final.index,
                plan.model_dump(mode="json"),
                final.result.to_dict() if final.result else None,
                res.confirmed[final.index].to_dict() if final.index in res.confirmed else None,
                str(out),
            )
        finally:
            if ev is not None:
                ev.close()
            store.close()
        _summary(res, plan, time.perf_counter() - t0)


def _plot(res: Outcome, path: Path | None) -> None:
    """The front plot, when asked for: written on every outcome (exit 2 included), the written plan starred."""
    if path is not None:
        from boute.optimize.plot import plot_front

        plot_front(res, path)


class _Progress:
    """Rich progress bar on stderr with the current best feasible plan."""

    def __init__(self, total: int, quiet: bool, objective: str = "latency") -> None:
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
                console=Console(stderr=True),
                transient=True,
            )
            self._p.__enter__()
            self._task = self._p.add_task("best: none feasible yet", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.__exit__(None, None, None)

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
        self._p.update(self._task, completed=self._done, description=desc)


def _summary(out: Outcome, plan: Plan, wall_s: float) -> None:
    p = plan.predicted
    confirming = [t for t in out.confirmations if t.result is not None]
    searched = sum(t.status == "confirm-search" for t in confirming)
    typer.echo(
        f"plan written ({out.objective.label}): {out.evaluations} evaluations ({out.resumed_trials} resumed)"
        + (f" + {len(confirming)} confirmations" if confirming else "")
        + (f" ({searched} by a search with the confirming evaluator)" if searched else "")
        + f", {wall_s:.1f} s; "
        f"experiment '{out.experiment_name}'"
    )
    if out.screen is not None:
        s, pl = out.screen["search"], out.screen["pool"]
        typer.echo(
            f"  screens: of {s['seen']} proposals, {s['projected']} moved onto the quality floor, "
            f"{s['quality']} below it, {s['capacity']} over the capacity bound (not evaluated); "
            f"acquisition pool: {pl['projected']} of {pl['seen']} moved, {pl['quality'] + pl['capacity']} removed"
        )
    if out.final is not None and out.final.result is not None:
        r = out.final.result
        typer.echo(
            f"  {r.evaluator}: quality {r.quality:.4f}, P95 {r.p95_latency_s:.3g} s, "
            f"{r.throughput_rps:.1f} req/s, ${r.cost_per_hour:.2f}/h"
        )
    if p is not None and p.evaluator != (out.final.result.evaluator if out.final and out.final.result else None):
        typer.echo(
            f"  {p.evaluator} (confirmed): quality {p.quality:.4f}, P95 {p.p95_latency_s:.3g} s, "
            f"{p.throughput_rps:.1f} req/s, meets targets: {p.feasible}"
        )
    fr = ", ".join(f"{t}={f:.3f}" for t, f in zip(plan.routing.tiers, plan.routing.fractions or [], strict=False))
    typer.echo(f"  routing ({plan.routing.mode}): {fr}")
    for g in plan.deployment:
        typer.echo(f"  {g.tier}: {g.count} x {g.model} on {g.gpu} (tp={g.tp}, pp={g.pp})")
