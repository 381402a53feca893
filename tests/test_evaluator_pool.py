"""The evaluator pool (``boute.optimize.evaluators.pool``): worker processes give the answers the search's own
evaluator gives, in the order asked, and start before the first batch when asked to."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from boute.optimize.evaluators.factory import make_evaluator
from boute.optimize.evaluators.pool import EvaluatorPool
from boute.optimize.space import Candidate, Space
from boute.specs import Scenario, load_scenario


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return load_scenario(None)


def _candidates(sc: Scenario, n: int, seed: int) -> list[Candidate]:
    sp = Space.build(sc)
    rng = np.random.default_rng(seed)
    return [sp.decode(rng.uniform(size=sp.dim)) for _ in range(n)]


def test_workers_answer_as_the_evaluator_does_in_the_order_asked(scenario: Scenario) -> None:
    ev = make_evaluator("fast", scenario, seed=3)
    cands = _candidates(scenario, 9, seed=11)
    here = [ev(c) for c in cands]
    with EvaluatorPool(ev, scenario, 3, workers=2) as pool:
        assert pool.workers == 2
        there = pool.map(cands)
        again = pool.map(cands[::-1])  # the same workers, a second batch
    for a, b in zip(here, there, strict=True):
        assert not isinstance(b, Exception)
        assert (b.p95_latency_s, b.cost_per_hour, b.quality) == (a.p95_latency_s, a.cost_per_hour, a.quality)
    assert [r.p95_latency_s for r in again] == [r.p95_latency_s for r in there[::-1]]  # type: ignore[union-attr]


def test_start_spawns_workers_that_hold_their_evaluator_before_any_batch(scenario: Scenario) -> None:
    ev = make_evaluator("fast", scenario, seed=0)
    pool = EvaluatorPool(ev, scenario, 0, workers=2)
    try:
        ready = pool.start()
        assert len(ready) == 2
        assert [f.result() for f in ready] == [True, True]  # waits on each worker's own answer, no timer
        assert pool.start() == []  # started once
        assert len(pool.map(_candidates(scenario, 4, seed=1))) == 4
    finally:
        pool.close()
        pool.close()  # idempotent


def test_a_pool_of_one_runs_in_process(scenario: Scenario) -> None:
    ev = make_evaluator("fast", scenario, seed=0)
    with EvaluatorPool(ev, scenario, 0, workers=1) as pool:
        assert pool.start() == []
        assert pool._pool is None
        assert len(pool.map(_candidates(scenario, 3, seed=2))) == 3
        assert pool._pool is None  # no process was spawned


def test_workers_give_the_prior_figures_this_process_computes(scenario: Scenario) -> None:
    """:meth:`EvaluatorPool.prior_p95`: the workers' fast path, built on their own quality model and the search's
    stream, gives each plan the very P95 the search's prior gives it here, in the order asked."""
    ev = make_evaluator("sim", scenario, seed=0)
    fast = make_evaluator("fast", scenario, seed=0, quality_model=ev.quality_model, workload=ev.workload)
    cands = _candidates(scenario, 31, seed=5)
    with EvaluatorPool(ev, scenario, 0, workers=2) as pool:
        got = pool.prior_p95(cands)
    assert got == [fast(c).p95_latency_s for c in cands]
    assert len(set(got)) > 5  # distinct plans, distinct figures: an order mix-up would show


def test_a_search_makes_the_same_trials_with_its_prior_in_the_workers(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A simulator search whose pools' prior figures are computed by the evaluation workers (every pool, however
    small, here), handed over in parts while the pool is still being built, proposes the same plans in the same
    order as one computing them itself."""
    import boute.optimize.session as session
    import boute.optimize.surrogates.prior as prior
    from boute.optimize.settings import SearchSettings

    calls: list[int] = []
    real = EvaluatorPool.prior_p95_soon

    def counted(self: EvaluatorPool, cands: list[Candidate]) -> Callable[[], list[float]]:
        calls.append(len(cands))
        return real(self, cands)

    monkeypatch.setattr(EvaluatorPool, "prior_p95_soon", counted)
    monkeypatch.setattr(prior, "MANY_FROM", 7)  # parts of 7 while the pool is built, the rest (< 7) after

    def search() -> list[str]:
        ev = make_evaluator("sim", scenario, seed=0)
        fast = make_evaluator("fast", scenario, seed=0, quality_model=ev.quality_model, workload=ev.workload)
        settings = SearchSettings(max_evals=24, patience=None, batch=4, workers=2, confirm=False)
        out = session.optimize(scenario, settings, session.SearchRuntime(evaluator=ev, prior=fast))
        return [t.candidate.key() for t in out.trials]

    in_workers = search()
    assert calls and sum(calls) > 100  # the prior did go to the workers, every step
    assert calls.count(7) > 10 and any(0 < n < 7 for n in calls)  # in parts, and the rest of a pool after them
    monkeypatch.setattr(session, "_idle_while_proposing", lambda pool, settings: False)
    n = len(calls)
    here = search()
    assert len(calls) == n  # ... and here it did not
    assert in_workers == here and len(here) >= 24  # (screened trials among them cost no evaluation)


def test_a_killed_worker_is_a_worker_error_and_the_next_batch_starts_afresh(scenario: Scenario) -> None:
    """Workers killed from outside (``SIGKILL``: the OOM killer, a user): the batch, and the prior's figures,
    raise :class:`WorkerError` instead of hanging or a bare ``BrokenProcessPool``; the pool then starts new
    workers for the next call."""
    import os
    import signal

    from boute.errors import WorkerError

    ev = make_evaluator("sim", scenario, seed=0)
    cands = _candidates(scenario, 4, seed=9)

    def kill_workers(pool: EvaluatorPool) -> None:
        ready = pool.start()
        assert [f.result() for f in ready] == [True, True]  # waits on the workers, no timer
        assert pool._pool is not None
        for pid in list(pool._pool._processes):
            os.kill(pid, signal.SIGKILL)

    pool = EvaluatorPool(ev, scenario, 0, workers=2)  # started by kill_workers, each time waited for
    try:
        for call in (lambda: pool.prior_p95(cands), lambda: pool.map(cands), lambda: pool.submit(cands).results()):
            kill_workers(pool)
            with pytest.raises(WorkerError, match="ended abruptly"):
                call()
            assert pool._pool is None
        assert len(pool.map(cands)) == 4  # fresh workers
    finally:
        pool.close()
