"""Evaluations in parallel: a pool of worker processes, each holding its own copy of an evaluator.

Why processes: the simulator and the fast path are pure Python + numpy and hold the GIL, so threads would
not overlap them. Each worker builds its evaluator once from an :class:`EvaluatorSpec` (the registered factory with the
same scenario, mode, seed and the search's own request stream, sent once), so a batch costs only the
candidates' pickling; results come back in the order asked,
which keeps a search's trials (and so its resumes) independent of which worker finished first. A batch can
be handed over without waiting for it (:meth:`EvaluatorPool.submit`), so the search proposes its next batch
while this one is evaluated (:mod:`boute.optimize.loop`). Evaluators
that own external state (``live``: a fleet and a gateway) are not pooled: the harness evaluates them in
turn. ``workers <= 1`` runs everything in this process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boute.errors import BouteError, WorkerError
from boute.optimize.evaluators.base import EvalResult, Evaluator
from boute.optimize.evaluators.factory import make_evaluator
from boute.optimize.registry import POOLABLE
from boute.optimize.space import Candidate
from boute.quality.policy_quality import QualityModel
from boute.specs import Scenario
from boute.workload import Workload

_worker_evaluator: Evaluator | None = None
_worker_spec: EvaluatorSpec | None = None
_worker_prior: Evaluator | None = None


def _exit_with_parent(parent: int) -> None:
    """End this worker when the search process is gone: a parent killed with SIGKILL runs no clean-up, and
    a worker blocked on its task queue would otherwise idle on for ever."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="boute-parent-watch", daemon=True).start()


def portable(scenario: Scenario) -> tuple[dict[str, Any], str | None, str]:
    """What a worker process rebuilds ``scenario`` from (a scenario's catalog does not pickle): its document,
    the file it came from (its relative references, the router and calibration files of a plan's bundle,
    resolve against that file's folder) and its reference."""
    src = scenario.source
    return scenario.model_dump(mode="json"), None if src is None else str(src), scenario.reference


def rebuilt(doc: dict[str, Any], source: str | None, reference: str) -> Scenario:
    """The scenario :func:`portable` describes, its file references resolving as in the parent process."""
    from boute.specs.scenario import scenario_from_mapping

    if source is None:
        return Scenario.model_validate(doc)
    return scenario_from_mapping(doc, Path(source), reference)


@dataclass(frozen=True)
class EvaluatorSpec:
    """What a worker rebuilds the search's evaluator from: plain, picklable values. The scenario travels as
    :func:`portable` gives it; the workload is the search's own stream (``Evaluator.workload``), sent rather
    than rebuilt so every worker judges plans on the very arrays the search, its screen and its plan do."""

    name: str
    scenario: tuple[dict[str, Any], str | None, str]
    mode: str
    seed: int
    workload: Workload | None

    @classmethod
    def of(cls, evaluator: Evaluator, scenario: Scenario, seed: int) -> EvaluatorSpec:
        return cls(evaluator.name, portable(scenario), evaluator.mode, seed, evaluator.workload)

    def build(self, name: str | None = None, quality_model: QualityModel | None = None) -> Evaluator:
        """The search's evaluator, or the one called ``name`` on the same scenario, mode, seed and stream (with
        ``quality_model``: scoring routing with that one instead of building its own)."""
        return make_evaluator(
            name or self.name,
            rebuilt(*self.scenario),
            self.mode,
            self.seed,
            quality_model=quality_model,
            workload=self.workload,
        )


def _init(spec: EvaluatorSpec, parent: int) -> None:
    global _worker_evaluator, _worker_spec
    _worker_spec = spec
    _exit_with_parent(parent)
    # one core per worker: the pool is the parallelism. Said through the environment, which torch reads when
    # it is first imported, not by importing torch here: the fast and sim evaluators never need it, and its
    # import cost each worker ~1.5 s of a core at the start of every search (the parent's busiest moment)
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # pragma: no cover - only if an import above pulled it in
        sys.modules["torch"].set_num_threads(1)
    _worker_evaluator = spec.build()


def attempt(evaluator: Evaluator, cand: Candidate) -> EvalResult | BouteError:
    """``evaluator(cand)``, or the BouteError it raised: a plan the evaluator cannot run is a failed trial,
    not a dead worker (what every pool's workers return)."""
    try:
        return evaluator(cand)
    except BouteError as exc:
        return exc


def _evaluate(cand: Candidate) -> EvalResult | BouteError:
    assert _worker_evaluator is not None
    return attempt(_worker_evaluator, cand)


def _prior_p95(cands: Sequence[Candidate]) -> list[float]:
    """The fast path's P95 of each of ``cands``, in a worker: the search's prior (:meth:`EvaluatorPool.prior_p95`),
    built on first use on the worker's own quality model and the search's stream, as the search builds it."""
    global _worker_prior
    assert _worker_evaluator is not None and _worker_spec is not None
    if _worker_prior is None:
        _worker_prior = _worker_spec.build("fast", _worker_evaluator.quality_model)
    return [float(_worker_prior(c).p95_latency_s) for c in cands]


def _ready() -> bool:
    return _worker_evaluator is not None


def default_workers() -> int:
    """Cores this process may use (its CPU affinity), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


class Submitted:
    """A batch handed to a pool: :meth:`results` waits for its results (or the ``BouteError`` each raised), in
    the order asked; ``ready_at`` is the ``time.monotonic()`` instant the last one came in (None before)."""

    def __init__(self, results: Sequence[EvalResult | BouteError] | None = None) -> None:
        self._results = None if results is None else list(results)
        self.ready_at: float | None = time.monotonic() if results is not None else None

    def results(self) -> list[EvalResult | BouteError]:
        assert self._results is not None  # a batch answered at once; the pools' own kinds override this
        return self._results


class _InWorkers(Submitted):
    """A batch out with the pool's worker processes (:meth:`EvaluatorPool.submit`)."""

    def __init__(self, futures: list[Future[EvalResult | BouteError]], pool: EvaluatorPool) -> None:
        super().__init__()
        self._futures, self._pool = futures, pool
        self._left = len(futures)
        self._lock = threading.Lock()
        for f in futures:
            f.add_done_callback(self._one_done)

    def _one_done(self, _: Future[EvalResult | BouteError]) -> None:
        with self._lock:  # (called in the executor's thread, or here for a future already done)
            self._left -= 1
            if self._left == 0:
                self.ready_at = time.monotonic()

    def results(self) -> list[EvalResult | BouteError]:
        try:
            return [f.result() for f in self._futures]
        except BrokenProcessPool as exc:
            raise self._pool.lost(exc) from exc


class EvaluatorPool:
    """``map(candidates)``: results (or the ``BouteError`` each raised) in order, from ``workers`` processes.

    ``evaluator`` is the search's own (its name, scenario, mode and seed are what the workers rebuild);
    it also evaluates whatever this pool cannot: a single candidate, or everything when ``workers <= 1``.
    """

    def __init__(self, evaluator: Evaluator, scenario: Scenario, seed: int, workers: int | None = None) -> None:
        self.evaluator = evaluator
        n = default_workers() if workers is None else workers
        self.workers = n if evaluator.name in POOLABLE else 1
        self._scenario, self._seed = scenario, seed
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: a clean interpreter per worker (forking a process that holds torch threads can deadlock)
            ctx = mp.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=ctx,
                initializer=_init,
                initargs=(EvaluatorSpec.of(self.evaluator, self._scenario, self._seed), os.getpid()),
            )
        return self._pool

    def start(self) -> list[Future[bool]]:
        """Spawn the workers now, without waiting for them: each one's start (an interpreter, the imports, its
        evaluator built) then overlaps whatever the search does before its first batch (its first proposals,
        the GP's first fit) instead of stalling that batch. Returns one future per worker, true once a worker
        holds its evaluator; none for an in-process pool or one already started."""
        if self.workers <= 1 or self._pool is not None:
            return []
        ex = self._executor()
        # one task each: the executor spawns a process for each task no idle worker can take
        return [ex.submit(_ready) for _ in range(self.workers)]

    def submit(self, cands: Sequence[Candidate]) -> Submitted:
        """Hand ``cands`` to the workers and return at once (:meth:`Submitted.results` waits for them): the
        search proposes its next batch meanwhile. Without workers (``workers <= 1``, or an evaluator that is not
        pooled) they are evaluated here before this returns."""
        if self.workers <= 1 or not cands:
            return Submitted([attempt(self.evaluator, c) for c in cands])
        ex = self._executor()
        try:
            return _InWorkers([ex.submit(_evaluate, c) for c in cands], self)
        except BrokenProcessPool as exc:
            raise self.lost(exc) from exc

    def map(self, cands: Sequence[Candidate]) -> list[EvalResult | BouteError]:
        if self.workers <= 1 or len(cands) <= 1:
            return [attempt(self.evaluator, c) for c in cands]
        try:
            return list(self._executor().map(_evaluate, cands))
        except BrokenProcessPool as exc:
            raise self.lost(exc) from exc

    def lost(self, exc: BrokenProcessPool) -> WorkerError:
        """The error for a pool whose worker died or whose initialiser raised (its reason is on stderr); the
        broken executor is dropped, so a later batch starts fresh workers."""
        self._pool = None
        return WorkerError(f"an evaluator worker process ended abruptly ({exc})")

    @property
    def computes_prior(self) -> bool:
        """Whether :meth:`prior_p95` can run here: worker processes, and an evaluator scoring routing with an
        exact quality model (the fast path the workers build needs it)."""
        return self.workers > 1 and self.evaluator.quality_model is not None

    def prior_p95(self, cands: Sequence[Candidate]) -> list[float]:
        """The fast path's P95 of each of ``cands`` (seconds, in order), computed by the workers in one chunk
        each: the prior of a simulator search (:class:`~boute.optimize.surrogates.prior.PriorLatency`) scores a
        candidate pool of thousands of plans (the 480-GPU fleet's: ~1,600 new ones a step, ~20 s of one core
        over a search) while the workers wait for the next batch. The workers' fast path is built as the
        search's (the same quality model, the same stream), so the figures are the ones this process would
        compute. Only for a pool with workers whose evaluator scores routing with an exact quality model."""
        return self.prior_p95_soon(cands)()

    def prior_p95_soon(self, cands: Sequence[Candidate]) -> Callable[[], list[float]]:
        """:meth:`prior_p95` started now, without waiting: the returned function waits for the figures and gives
        them. The search hands a pool's plans over in parts while it is still building the rest, so the workers
        score the first parts while this process screens and decodes the next."""
        if not self.computes_prior:
            raise ValueError("prior_p95 needs worker processes and an evaluator with an exact quality model")
        n = self.workers
        chunks = [list(cands[i::n]) for i in range(n)]
        try:
            futures = [self._executor().submit(_prior_p95, c) for c in chunks if c]
        except BrokenProcessPool as exc:
            raise self.lost(exc) from exc

        def figures() -> list[float]:
            try:
                got = [f.result() for f in futures]
            except BrokenProcessPool as exc:
                raise self.lost(exc) from exc
            out = [0.0] * len(cands)
            for i, vals in enumerate(got):
                out[i::n] = vals
            return out

        return figures

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> EvaluatorPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
