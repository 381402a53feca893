"""Make a plan, end to end: the one entry point ``boute optimize`` and the re-plan loop call.

search (:func:`boute.optimize.session.optimize`) -> confirm with a more faithful evaluator
(:func:`boute.optimize.confirm.confirm`) -> build the plan (:func:`~boute.optimize.session.build_plan`) ->
write it with its bundle, atomically (:func:`boute.serving.bundle.write_plan`) -> record it in the tracking
DB. A request is a frozen, picklable :class:`PlanRequest`; the answer is a typed :class:`PlanRun` (the plan
as written and what the run did), and every failure is a typed error: :class:`~boute.errors.InfeasibleError`
when no plan meets the targets, :class:`~boute.errors.UnconfirmedError` when the confirming evaluator rejects
every plan it checked (nothing is written in either case), a :class:`~boute.errors.BouteError` naming the
option for a bad request. :class:`PlanWorker` runs requests in a spawned worker process, for a caller that
must outlive a search that crashes (the re-plan loop), and answers a dead worker with
:class:`~boute.errors.WorkerError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boute.errors import BouteError, InfeasibleError, UnconfirmedError, WorkerError
from boute.optimize.registry import EVALUATORS, OBJECTIVES, PREFERENCES, STRATEGIES
from boute.quality.policy_quality import JUDGES
from boute.quality.router_kinds import TRAINED_KINDS
from boute.serving.registry import DEFAULT_REDIS_URL
from boute.specs.plan import ROUTING_MODES

if TYPE_CHECKING:
    from boute.optimize.clock import SearchClock
    from boute.optimize.evaluators.base import EvalResult
    from boute.optimize.outcome import Outcome
    from boute.optimize.trials import Trial
    from boute.specs import Plan, Scenario


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for and how to search. Plain values only, so a request can go to a worker process.

    ``scenario``: a scenario file or ``builtin:NAME`` (None: the default); ``budget``, ``quality_floor`` and
    ``p95_cap`` override its targets, ``calibration`` its calibration file. The rest are the options of
    ``boute optimize`` of the same names (``patience`` None: never stop early).
    """

    out: Path
    scenario: str | None = None
    budget: float | None = None
    quality_floor: float | None = None
    p95_cap: float | None = None
    quality_confidence: float | None = None  # hold the floor on the lower bound at this level
    judge: str | None = None  # the cascade's judge, overriding the scenario's quality.judge (verifier | llm)
    router: str | None = None  # the pre-router, overriding the scenario's quality.router_kind (ladder | multi)
    calibration: Path | None = None
    max_evals: int = 60
    objective: str = "latency"
    prefer: str | None = None
    screen: bool = True
    strategy: str = "mobo"
    evaluator: str = "sim"
    batch: int = 4
    workers: int | None = None  # None: the cores this process may use (with ray_address: the cluster's CPUs)
    ray_address: str | None = None  # evaluate on this Ray cluster's actors instead of local processes
    time_budget_s: float | None = None
    mode: str = "preroute"
    seed: int = 0
    db: str | None = None
    experiment: str | None = None
    patience: int | None = 20
    confirm: bool = True
    confirm_with: str = "sim"
    max_confirm: int = 12
    plot: Path | None = None
    redis_url: str = DEFAULT_REDIS_URL

    def check(self) -> None:
        """BouteError naming the option at fault (as ``boute optimize`` spells it) for a request that cannot run."""
        STRATEGIES.get(self.strategy)
        OBJECTIVES.get(self.objective)
        if self.prefer is not None:
            PREFERENCES.get(self.prefer)
            if self.objective != "pareto":
                raise BouteError(
                    f"--prefer: picks a plan from the pareto front; it needs --objective pareto, not {self.objective}"
                )
        EVALUATORS.get(self.evaluator)
        EVALUATORS.get(self.confirm_with, "--confirm-with")
        if self.ray_address is not None:
            from boute.optimize.evaluators.pool import POOLABLE

            if self.evaluator not in POOLABLE:
                raise BouteError(
                    f"--ray-address: the {self.evaluator} evaluator runs in this process; "
                    f"only {', '.join(sorted(POOLABLE))} evaluations go to a Ray cluster"
                )
        if self.mode not in ROUTING_MODES:
            raise BouteError(f"--mode: unknown routing mode '{self.mode}' (known: {', '.join(ROUTING_MODES)})")
        if self.judge is not None and self.judge not in JUDGES:
            raise BouteError(f"--judge: unknown cascade judge '{self.judge}' (known: {', '.join(JUDGES)})")
        if self.router is not None and self.router not in TRAINED_KINDS:
            raise BouteError(f"--router: unknown pre-router '{self.router}' (known: {', '.join(TRAINED_KINDS)})")
        if self.quality_floor is not None and not 0 <= self.quality_floor <= 1:
            raise BouteError(f"--quality-floor: {self.quality_floor} is not in [0, 1]")
        if self.quality_confidence is not None and not 0.5 <= self.quality_confidence < 1:
            raise BouteError(f"--quality-confidence: {self.quality_confidence} is not in [0.5, 1)")
        for opt, v in (("--budget", self.budget), ("--p95-cap", self.p95_cap)):
            if v is not None and v <= 0:
                raise BouteError(f"{opt}: must be > 0, got {v}")
        for opt, n in (("--max-evals", self.max_evals), ("--max-confirm", self.max_confirm)):
            if n < 1:
                raise BouteError(f"{opt}: must be >= 1, got {n}")

    def load_scenario(self) -> Scenario:
        """The scenario with this request's overrides (targets, calibration) applied."""
        from boute.optimize.session import with_targets
        from boute.specs import load_scenario
        from boute.specs.scenario import with_judge, with_quality_confidence, with_router_kind

        sc = with_targets(load_scenario(self.scenario), self.budget, self.quality_floor, self.p95_cap)
        sc = with_quality_confidence(sc, self.quality_confidence)
        sc = with_judge(sc, self.judge)
        sc = with_router_kind(sc, self.router)
        if self.calibration is not None:
            from boute.perf import with_calibration

            sc = with_calibration(sc, self.calibration)
        return sc


@dataclass(frozen=True)
class RunSummary:
    """What one run did, for the caller to show or record."""

    objective: str  # the label that chose the plan: latency | cost | pareto:<prefer>
    experiment: str | None
    evaluations: int  # trials that cost an evaluation (screened ones did not)
    resumed_trials: int
    confirmations: int  # confirming evaluations that gave a result
    confirm_searched: int  # of them, those by a search with the confirming evaluator
    screen: dict[str, dict[str, int]] | None  # ScreenCounts of the proposals and of MOBO's pool
    searched: EvalResult | None  # the written plan by the search's evaluator
    phase_s: dict[str, float]  # where the time went: seconds per phase (boute.optimize.clock)


@dataclass(frozen=True)
class PlanRun:
    """A plan made: as written (bundle paths, scenario and balance figures in it), where, and how."""

    plan: Plan
    path: Path
    summary: RunSummary
    wall_s: float


def summarise(res: Outcome) -> RunSummary:
    confirming = [t for t in res.confirmations if t.result is not None]
    return RunSummary(
        objective=res.objective.label,
        experiment=res.experiment_name,
        evaluations=res.evaluations,
        resumed_trials=res.resumed_trials,
        confirmations=len(confirming),
        confirm_searched=sum(t.status == "confirm-search" for t in confirming),
        screen=res.screen,
        searched=res.final.result if res.final is not None else None,
        phase_s=res.clock.snapshot(),
    )


def _plot(res: Outcome, path: Path | None) -> None:
    """The front plot, when asked for: written on every outcome (an infeasible one too), the written plan starred."""
    if path is not None:
        from boute.optimize.plot import plot_front

        plot_front(res, path)


def make_plan(
    req: PlanRequest,
    *,
    on_trial: Callable[[Trial, list[Trial]], None] | None = None,
    on_searched: Callable[[Outcome], None] | None = None,
    clock: SearchClock | None = None,
) -> PlanRun:
    """Search, confirm, write and record one plan (module doc). ``on_trial``: each finished trial (a progress
    bar); ``on_searched``: the search's outcome before confirmation; ``clock``: where the time goes, by phase,
    for a caller that shows it live (the summary has it anyway). Raises InfeasibleError, UnconfirmedError
    or BouteError; a plan is written only once it is confirmed."""
    from boute.optimize import confirm as confirmation
    from boute.optimize import session
    from boute.optimize.evaluators.base import llm_judge_of, router_files_of, router_of, scorer_of, verifier_of
    from boute.optimize.registry import make_evaluator
    from boute.quality import quality_model_for
    from boute.quality.judges import verifier_files
    from boute.serving.bundle import open_plan, write_plan
    from boute.tracking import open_store

    req.check()
    t0 = time.perf_counter()
    searching, confirming = EVALUATORS.get(req.evaluator), EVALUATORS.get(req.confirm_with, "--confirm-with")
    sc = req.load_scenario()
    store = open_store(req.db)
    ev: Any = None
    try:
        # the live evaluator owns a gateway and replica processes: closed on every exit, Ctrl-C included
        ev = make_evaluator(req.evaluator, sc, req.mode, req.seed, redis_url=req.redis_url)
        # the plan routes with the scenario's learned router (a live search measures quality instead)
        quality_model = ev.quality_model or quality_model_for(sc)
        # the fast path as the prior a simulator (or live) search corrects: cheap, and right in shape
        fast = (
            make_evaluator("fast", sc, req.mode, req.seed, quality_model=ev.quality_model)
            if searching.fidelity > 0 and ev.quality_model is not None
            else None
        )
        res = session.optimize(
            sc,
            strategy=req.strategy,
            evaluator=ev,
            max_evals=req.max_evals,
            seed=req.seed,
            mode=req.mode,
            patience=req.patience or None,
            store=store,
            experiment=req.experiment,
            on_trial=on_trial,
            objective=req.objective,
            prefer=req.prefer,
            screen=req.screen,
            prior=fast,
            batch=req.batch,
            workers=req.workers,  # None: one per core (EvaluatorPool), or per CPU of the Ray cluster
            ray_address=req.ray_address,
            time_budget_s=req.time_budget_s,
            clock=clock,
        )
        searcher = ev
        ev.close()  # replicas of a live search are not needed to confirm or write the plan
        if on_searched is not None:
            on_searched(res)
        if res.chosen is None:
            _plot(res, req.plot)
            raise InfeasibleError(res.infeasible_message())
        if req.confirm and confirming.fidelity > searching.fidelity:  # confirmations only move up
            checker = make_evaluator(
                req.confirm_with, sc, req.mode, req.seed, quality_model=ev.quality_model, redis_url=req.redis_url
            )
            ev = checker  # closed by the finally below, whatever happens while confirming
            # a cheap search evaluator (the fast path) is the prior whose error a continued search learns
            prior = searcher if searching.fidelity == 0 else None
            with res.clock.timing("confirm"):
                confirmation.confirm(res, checker, store=store, max_evals=req.max_confirm, seed=req.seed, prior=prior)
            checker.close()
        elif req.confirm and res.chosen.result is not None:  # the search's evaluator is already as faithful
            res.confirmed[res.chosen.index] = res.chosen.result
        _plot(res, req.plot)
        final = res.final
        if final is None:  # the confirming evaluator rejected every plan it checked: write nothing
            raise UnconfirmedError(res.unconfirmed_message())
        # a pre-routed plan routes with the learned router; a cascade is judged by the judge its thresholds
        # were cut on: the verifier, or the LLM judge whose scores the profile recorded
        router = router_of(quality_model) if req.mode == "preroute" else None
        verifier = verifier_of(quality_model) if req.mode == "cascade" else None
        judge_model = llm_judge_of(quality_model) if req.mode == "cascade" else None
        plan = session.build_plan(sc, res, req.mode, router, verifier, judge_model, scorer_of(quality_model))
        if plan.routing.mode == "cascade" and plan.routing.judge is None:
            raise BouteError("the cascade's judge was not built: no judge can reproduce its thresholds")
        # self-contained: the router or verifier, the scenario and its files travel with the plan (a bundle)
        path = write_plan(
            plan,
            req.out,
            sc,
            router_files_of(quality_model) if router else (),
            verifier_files=verifier_files(verifier) if verifier else (),
        )
        assert res.experiment_id is not None  # a search with a store always records its experiment
        store.add_plan(
            res.experiment_id,
            final.index,
            plan.model_dump(mode="json"),
            final.result.to_dict() if final.result else None,
            res.confirmed[final.index].to_dict() if final.index in res.confirmed else None,
            str(req.out),
        )
    finally:
        if ev is not None:
            ev.close()
        store.close()
    return PlanRun(open_plan(path), path, summarise(res), time.perf_counter() - t0)


def prepare_search_process() -> None:
    """A search worker as the CLI runs one: two torch threads, GPyTorch's handled jitter warnings silent."""
    import warnings

    import torch
    from linear_operator.utils.warnings import NumericalWarning

    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", category=NumericalWarning)


class PlanWorker:
    """:func:`make_plan` in a spawned worker process, kept between requests (the optimiser's imports are paid
    once) and replaced when it dies. Why a process: a search that crashes, is killed or leaks memory must
    not take its caller down; typed results and errors come back over the pool (they are picklable)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._busy = False

    def run(self, req: PlanRequest) -> PlanRun:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=prepare_search_process)
        fut = self._pool.submit(make_plan, req)
        self._busy = True
        try:
            out = fut.result()
        except BaseException as exc:
            self._busy = not fut.done()  # interrupted here (Ctrl-C, SIGTERM): close() terminates the worker
            if isinstance(exc, BouteError):
                raise
            if isinstance(exc, BrokenProcessPool):
                self.close()
                raise WorkerError(f"the search worker died before answering ({exc or 'no reason given'})") from None
            if isinstance(exc, Exception):  # a bug in the search: typed for the caller, the remote traceback kept
                raise WorkerError(f"the search failed: {type(exc).__name__}: {exc}") from exc
            raise
        self._busy = False
        return out

    def close(self) -> None:
        """Stop the worker: at once when a run was interrupted (Ctrl-C, SIGTERM: a search can take minutes)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if not self._busy:
            pool.shutdown(wait=True)
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())  # no public handle before Python 3.14
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(timeout=30)
        self._busy = False

    def __enter__(self) -> PlanWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
