"""Evaluations on a Ray cluster (boute/optimize/evaluators/ray_pool.py): a real local Ray node on loopback
with two CPUs, so two actors; a search evaluated there records the trials a search in this process records."""

from __future__ import annotations

import pytest

from boute.errors import BouteError
from boute.optimize.evaluators.fast import FastEvaluator
from boute.optimize.evaluators.pool import EvaluatorPool
from boute.optimize.evaluators.ray_pool import RayEvaluatorPool, check_reachable
from boute.optimize.loop import LoopHooks, run_search
from boute.optimize.settings import SearchSettings
from boute.optimize.space import Space
from boute.optimize.strategies.factory import make_strategy
from boute.specs import load_scenario

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # a Ray node starts (~15 s) and spawns its workers


@pytest.fixture(scope="module")
def ray_node() -> object:
    import ray

    from backends.deploy.ray_local import init_local_cluster

    init_local_cluster({}, loopback=True, namespace="boute-test-pool", num_cpus=2)
    yield ray
    ray.shutdown()


def test_the_live_evaluator_is_not_sent_to_ray(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.cli import run_cli

    got = run_cli(["optimize", "--evaluator", "live", "--ray-address", "auto", "--out", "p.json"], capsys)
    assert got.returncode == 2 and got.stderr.startswith("error: --ray-address: the live evaluator runs in this")


def _search(pool: EvaluatorPool) -> list[tuple[str, float | None, str | None]]:
    sc = load_scenario(None)
    space = Space.build(sc)
    with pool:
        trials = run_search(
            space,
            pool.evaluator,
            make_strategy("random", space, 5),
            SearchSettings(max_evals=24, batch=6, patience=None),
            hooks=LoopHooks(pool=pool),
        )
    return [(t.candidate.key(), None if t.result is None else t.result.p95_latency_s, t.error) for t in trials]


def test_a_search_on_ray_actors_records_the_trials_a_local_one_does(ray_node: object) -> None:
    sc = load_scenario(None)
    ray_pool = RayEvaluatorPool(FastEvaluator(sc), sc, 0, address=None)
    on_ray = _search(ray_pool)
    assert ray_pool.workers == 2  # one actor per CPU of the node
    local = _search(EvaluatorPool(FastEvaluator(sc), sc, 0, workers=1))
    assert len(on_ray) == 24 and on_ray == local  # same plans, same figures, same order
    assert ray_node.is_initialized()  # a pool that did not connect leaves the caller's connection alone


def test_workers_never_exceed_the_clusters_cpus(ray_node: object) -> None:
    sc = load_scenario(None)
    pool = RayEvaluatorPool(FastEvaluator(sc), sc, 0, address=None, workers=8)
    with pool:
        assert pool.workers == 2  # an actor that cannot be placed would wait for ever


def test_an_address_where_no_cluster_answers_is_a_one_line_error_not_a_wait() -> None:
    from tests.services import free_port

    address = f"127.0.0.1:{free_port()}"  # nothing listens there: Ray alone would retry for minutes
    for form in (address, f"ray://{address}"):  # (what RayEvaluatorPool.start checks before ray.init)
        with pytest.raises(BouteError, match=f"--ray-address: no Ray cluster answers at '{form}'"):
            check_reachable(form)
