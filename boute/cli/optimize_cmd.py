"""``boute optimize``: co-optimise routing and heterogeneous deployment, write the plan.

Trials are recorded in the tracking database as they finish; rerunning the same command (or naming the
same ``--experiment``) resumes from them. Infeasible targets give one line and exit code 2.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer

from boute.optimize.registry import EVALUATORS, STRATEGIES


def register(app: typer.Typer) -> None:
    @app.command("optimize")
    def optimize_cmd(
        out: Path = typer.Option(..., "--out", "-o", help="plan file to write (JSON or YAML)"),
        scenario: str | None = typer.Option(None, "--scenario", "-s", help="scenario YAML or builtin:NAME"),
        budget: float | None = typer.Option(None, "--budget", help="USD/h budget (overrides the scenario)"),
        quality_floor: float | None = typer.Option(None, "--quality-floor", help="minimum quality in [0,1]"),
        p95_cap: float | None = typer.Option(None, "--p95-cap", help="P95 end-to-end latency cap, seconds"),
        max_evals: int = typer.Option(60, "--max-evals", min=1, help="evaluation budget"),
        strategy: str = typer.Option("mobo", "--strategy", help=STRATEGIES.choices()),
        evaluator: str = typer.Option("fast", "--evaluator", help=EVALUATORS.choices()),
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
        """Find the lowest-P95 plan meeting the quality floor and the P95 cap within the budget."""
        import warnings

        import torch
        from linear_operator.utils.warnings import NumericalWarning

        from boute.errors import BouteError, InfeasibleError
        from boute.optimize import session
        from boute.optimize.evaluators import make_evaluator
        from boute.specs import load_scenario, save_plan
        from boute.tracking import open_store

        torch.set_num_threads(2)
        # GPyTorch adds jitter to near-singular kernel matrices and says so; that is handled, not news to a user
        warnings.filterwarnings("ignore", category=NumericalWarning)
        STRATEGIES.get(strategy)
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
        progress = _Progress(max_evals, quiet)
        ev = None
        try:
            # the live evaluator owns a gateway and replica processes: closed on every exit, Ctrl-C included
            ev = make_evaluator(evaluator, sc, mode, seed, redis_url=redis)
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
                )
            ev.close()  # replicas of a live search are not needed to confirm or write the plan
            if res.resumed_trials:
                typer.echo(
                    f"resumed experiment '{res.experiment_name}' from {res.resumed_trials} stored trials", err=True
                )
            if plot is not None:
                from boute.optimize.plot import plot_front

                plot_front(res, plot)
            if res.chosen is None:
                raise InfeasibleError(res.infeasible_message())
            if confirm and confirming.fidelity > searching.fidelity:  # confirmations only move up
                checker = make_evaluator(confirm_with, sc, mode, seed, quality_model=ev.quality_model, redis_url=redis)
                ev = checker  # closed by the finally below, whatever happens while confirming
                session.confirm(res, checker, store=store)
                checker.close()
            elif confirm and res.chosen.result is not None:  # the search's evaluator is already as faithful
                res.confirmed[res.chosen.index] = res.chosen.result
            plan = session.build_plan(sc, res, mode)
            save_plan(plan, out)
            store.add_plan(
                res.experiment_id,
                res.final.index if res.final else None,
                plan.model_dump(mode="json"),
                res.final.result.to_dict() if res.final and res.final.result else None,
                res.confirmed[res.final.index].to_dict() if res.final and res.final.index in res.confirmed else None,
                str(out),
            )
        finally:
            if ev is not None:
                ev.close()
            store.close()
        _summary(res, plan, time.perf_counter() - t0)


class _Progress:
    """Rich progress bar on stderr with the current best feasible plan."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.quiet = quiet
        self.total = total
        self._p = None
        self._task = None
        self._best: tuple[float, float] | None = None

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

    def update(self, trial, trials) -> None:  # noqa: ANN001
        if self._p is None:
            return
        r = trial.result
        if r is not None and r.feasible and (self._best is None or r.p95_latency_s < self._best[0]):
            self._best = (r.p95_latency_s, r.quality)
        desc = (
            "best: none feasible yet"
            if self._best is None
            else f"best: P95 {self._best[0]:.3g} s, quality {self._best[1]:.4f}"
        )
        self._p.update(self._task, completed=len(trials) + 1, description=desc)


def _summary(out, plan, wall_s: float) -> None:  # noqa: ANN001
    p = plan.predicted
    typer.echo(
        f"plan written: {len(out.trials)} evaluations ({out.resumed_trials} resumed)"
        + (f" + {len(out.confirmations)} confirmations" if out.confirmations else "")
        + f", {wall_s:.1f} s; "
        f"experiment '{out.experiment_name}'"
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
