"""Make a plan, end to end: the one entry point ``boute optimize`` and the re-plan loop call.

search (:func:`boute.optimize.session.optimize`) -> confirm with a more faithful evaluator
(:func:`boute.optimize.confirm.confirm`) -> build the plan (:func:`boute.optimize.final_plan.build_plan`) ->
write it with its bundle, atomically (:func:`boute.serving.bundle.write_plan`) -> record it in the tracking
DB: the named steps of :func:`make_plan`. A request is a frozen, picklable, validated :class:`PlanRequest`
holding the search's :class:`~boute.optimize.settings.SearchSettings` whole; the answer is a typed
:class:`PlanRun` (the plan as written and what the run did), and every failure is a typed error: :class:`~boute.errors.InfeasibleError`
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
from contextlib import ExitStack
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boute.errors import BouteError, InfeasibleError, UnconfirmedError, WorkerError
from boute.optimize.registry import EVALUATORS
from boute.optimize.settings import SearchSettings
from boute.optimize.status import ExperimentStatus, TrialStatus
from boute.quality.policy_quality import JUDGES
from boute.quality.router_kinds import TRAINED_KINDS
from boute.serving.registry import DEFAULT_REDIS_URL

if TYPE_CHECKING:
    from boute.optimize.clock import Milestone, SearchClock
    from boute.optimize.evaluators.base import EvalResult, Evaluator
    from boute.optimize.outcome import Outcome
    from boute.optimize.screen import ScreenReport
    from boute.optimize.trial_store import TrialStore
    from boute.optimize.trials import Trial
    from boute.specs import Plan, Scenario
    from boute.specs.balancing import Affinity


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for, where to write it, and how to search (``search``). Plain values only, so a request
    can go to a worker process; a request that cannot run is refused when it is made (a BouteError naming
    the option at fault, as ``boute optimize`` spells it).

    ``scenario``: a scenario file or ``builtin:NAME`` (None: the default); ``budget``, ``quality_floor`` and
    ``p95_cap`` override its targets, ``quality_confidence`` holds the floor on the lower bound at that
    level, ``judge`` the cascade's judge (verifier | llm) and ``router`` the pre-router (ladder | multi),
    ``calibration`` its calibration file. ``db``: the tracking DB; ``plot``: the front plot to write;
    ``redis_url``: the live evaluator's replica registry. ``affinity``: the cache-aware balancing the plan's
    gateway applies, in place of the scenario's ``balancing.affinity`` (``enabled: false``: least load; None:
    the scenario's); the search judges plans under it and the plan carries it.
    """

    out: Path
    scenario: str | None = None
    budget: float | None = None
    quality_floor: float | None = None
    p95_cap: float | None = None
    quality_confidence: float | None = None
    judge: str | None = None
    router: str | None = None
    calibration: Path | None = None
    db: str | None = None
    plot: Path | None = None
    redis_url: str = DEFAULT_REDIS_URL
    search: SearchSettings = field(default_factory=SearchSettings)
    affinity: Affinity | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """BouteError naming the option at fault for a request that cannot run (the search's own settings
        are checked when they are made: :class:`~boute.optimize.settings.SearchSettings`)."""
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

    def load_scenario(self) -> Scenario:
        """The scenario with this request's overrides (targets, calibration) applied."""
        from boute.specs import load_scenario
        from boute.specs.scenario import with_affinity, with_judge, with_quality_confidence, with_router_kind

        sc = with_targets(load_scenario(self.scenario), self.budget, self.quality_floor, self.p95_cap)
        sc = with_quality_confidence(sc, self.quality_confidence)
        sc = with_judge(sc, self.judge)
        sc = with_router_kind(sc, self.router)
        sc = with_affinity(sc, self.affinity)
        if self.calibration is not None:
            from boute.perf import with_calibration

            sc = with_calibration(sc, self.calibration)
        return sc


def with_targets(scenario: Scenario, budget: float | None, floor: float | None, cap: float | None) -> Scenario:
    """The scenario with CLI overrides of budget, quality floor and P95 cap."""
    upd: dict[str, Any] = {}
    if budget is not None:
        upd["cluster"] = scenario.cluster.model_copy(update={"budget_per_hour": float(budget)})
    t: dict[str, Any] = {}
    if floor is not None:
        t["quality_floor"] = float(floor)
    if cap is not None:
        t["p95_latency_s"] = float(cap)
    if t:
        upd["targets"] = scenario.targets.model_copy(update=t)
    return scenario.model_copy(update=upd) if upd else scenario


@dataclass(frozen=True)
class RunSummary:
    """What one run did, for the caller to show or record."""

    objective: str  # the label that chose the plan: latency | cost | pareto:<prefer>
    experiment: str | None
    evaluations: int  # trials that cost an evaluation (screened ones did not)
    resumed_trials: int
    confirmations: int  # confirming evaluations that gave a result
    confirm_searched: int  # of them, those by a search with the confirming evaluator
    screen: ScreenReport | None  # what the screens did to the proposals and to MOBO's pool
    searched: EvalResult | None  # the written plan by the search's evaluator
    phase_s: dict[str, float]  # where the time went: seconds per phase (boute.optimize.clock)
    beside_s: dict[str, float] = field(default_factory=dict)  # seconds a phase ran beside the others
    first_feasible: Milestone | None = None  # when the first plan meeting the targets was evaluated


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
        confirm_searched=sum(t.status == TrialStatus.CONFIRM_SEARCH for t in confirming),
        screen=res.screen,
        searched=res.final.result if res.final is not None else None,
        phase_s=res.clock.snapshot(),
        beside_s=res.clock.beside_snapshot(),
        first_feasible=res.clock.marks.get("first_feasible"),
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
    from boute.optimize.clock import SearchClock
    from boute.serving.bundle import open_plan
    from boute.tracking import open_store

    t0 = time.perf_counter()
    sc = req.load_scenario()
    store = open_store(req.db)
    try:
        # the live evaluator owns a gateway and replica processes: closed on every exit, Ctrl-C included
        with ExitStack() as evaluators:
            res, searcher = _search(req, sc, store, evaluators, on_trial, clock or SearchClock())
            if on_searched is not None:
                on_searched(res)
            if res.chosen is None:
                _plot(res, req.plot)
                raise InfeasibleError(res.infeasible_message())
            res = _confirm(req, sc, store, res, searcher, evaluators)
            _plot(res, req.plot)
            path = _write(req, sc, res, searcher)
            written = open_plan(path)
            _record(store, res, written, str(req.out), time.perf_counter() - t0)
    finally:
        store.close()
    return PlanRun(written, path, summarise(res), time.perf_counter() - t0)


def _record(store: TrialStore, res: Outcome, plan: Plan, path: str, wall_s: float) -> None:
    """The plan as written (its bundle, scenario and balance weights included: what ``boute report`` draws and
    ``boute verify`` finds it by) and where the run's time went, the confirmation's included, with its wall
    time (the experiment's ``phase_s`` and ``wall_s``; the search recorded its own phases when it ended)."""
    final = res.final
    assert res.experiment_id is not None and final is not None  # a written plan was searched with a store
    store.add_plan(
        res.experiment_id,
        final.index,
        plan.model_dump(mode="json"),
        final.result.to_dict() if final.result else None,
        res.confirmed[final.index].to_dict() if final.index in res.confirmed else None,
        path,
    )
    store.set_status(
        res.experiment_id, ExperimentStatus.COMPLETE, phase_s=res.clock.snapshot(), wall_s=round(wall_s, 3)
    )


def _search(
    req: PlanRequest,
    sc: Scenario,
    store: TrialStore,
    evaluators: ExitStack,
    on_trial: Callable[[Trial, list[Trial]], None] | None,
    clock: SearchClock,
) -> tuple[Outcome, Evaluator]:
    """The search (:func:`boute.optimize.session.optimize`) with the request's evaluator (returned, closed),
    and the fast path as the prior a simulator (or live) search corrects: cheap, and right in shape."""
    from boute.optimize import session
    from boute.optimize.evaluators.factory import make_evaluator
    from boute.optimize.prepare import prepared

    s = req.search
    ev = prepared(clock, s.evaluator, sc, s.mode, s.seed, redis_url=req.redis_url)  # the clock's "prepare"
    evaluators.callback(ev.close)
    fast = (
        make_evaluator("fast", sc, s.mode, s.seed, quality_model=ev.quality_model, workload=ev.workload)
        if EVALUATORS.get(s.evaluator).fidelity > 0 and ev.quality_model is not None
        else None
    )
    runtime = session.SearchRuntime(evaluator=ev, prior=fast, store=store, on_trial=on_trial, clock=clock)
    res = session.optimize(sc, s, runtime)
    ev.close()  # replicas of a live search are not needed to confirm or write the plan
    return res, ev


def _confirm(
    req: PlanRequest, sc: Scenario, store: TrialStore, res: Outcome, searcher: Evaluator, evaluators: ExitStack
) -> Outcome:
    """The outcome confirmed by ``--confirm-with`` when it is more faithful than the search's evaluator
    (confirmations only move up), by the search itself when that is already as faithful; a plan is final
    only when its confirmation accepts it (UnconfirmedError otherwise)."""
    from boute.optimize import confirm as confirmation
    from boute.optimize.evaluators.factory import make_evaluator

    s = req.search
    searching, confirming = EVALUATORS.get(s.evaluator), EVALUATORS.get(s.confirm_with, "--confirm-with")
    if s.confirm and confirming.fidelity > searching.fidelity:
        # the search's stream, where the confirming evaluator judges on one (the live one samples its own)
        checker = make_evaluator(
            s.confirm_with,
            sc,
            s.mode,
            s.seed,
            quality_model=searcher.quality_model,
            workload=searcher.workload,
            redis_url=req.redis_url,
        )
        evaluators.callback(checker.close)
        # a cheap search evaluator (the fast path) is the prior whose error a continued search learns
        prior = searcher if searching.fidelity == 0 else None
        with res.clock.timing("confirm"):
            res = confirmation.confirm(res, checker, store=store, max_evals=s.max_confirm, seed=s.seed, prior=prior)
        checker.close()
    elif s.confirm:
        res = res.confirmed_by_search()
    return res


def _write(req: PlanRequest, sc: Scenario, res: Outcome, searcher: Evaluator) -> Path:
    """Build the final plan and write it with its bundle (atomically); nothing is written when the
    confirming evaluator rejected every plan it checked. The plan routes with the search's quality model (a
    live search measures quality instead: the scenario's learned router), and its replicas are balanced by
    their capacities under the stream the search judged it on (``searcher.workload``)."""
    from boute.optimize.evaluators.base import llm_judge_of, router_files_of, router_of, scorer_of, verifier_of
    from boute.optimize.final_plan import build_plan
    from boute.quality import quality_model_for
    from boute.quality.judges import verifier_files
    from boute.serving.bundle import write_plan

    final = res.final
    if final is None:
        raise UnconfirmedError(res.unconfirmed_message())
    quality_model = searcher.quality_model or quality_model_for(sc)
    mode = req.search.mode
    # a pre-routed plan routes with the learned router; a cascade is judged by the judge its thresholds
    # were cut on: the verifier, or the LLM judge whose scores the profile recorded
    router = router_of(quality_model) if mode == "preroute" else None
    verifier = verifier_of(quality_model) if mode == "cascade" else None
    judge_model = llm_judge_of(quality_model) if mode == "cascade" else None
    plan = build_plan(sc, res, mode, router, verifier, judge_model, scorer_of(quality_model))
    if plan.routing.mode == "cascade" and plan.routing.judge is None:
        raise BouteError("the cascade's judge was not built: no judge can reproduce its thresholds")
    # self-contained: the router or verifier, the scenario and its files travel with the plan (a bundle)
    return write_plan(
        plan,
        req.out,
        sc,
        router_files_of(quality_model) if router else (),
        verifier_files=verifier_files(verifier) if verifier else (),
        workload=searcher.workload,
    )


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
