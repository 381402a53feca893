"""The seeded random scenario generator (bench.random_scenarios): valid, deterministic, covering its ranges."""

from __future__ import annotations

import pytest

from bench.random_scenarios import ARRIVALS, LOAD_RANGE, SHAPES, STRONG, WEAK, draw_scenario, random_scenario
from boute.optimize.space import Space
from boute.specs.scenario import Scenario

SEEDS = range(48)


@pytest.fixture(scope="module")
def draws():  # type: ignore[no-untyped-def]
    return [draw_scenario(s) for s in SEEDS]


def test_every_seed_gives_a_valid_servable_scenario(draws) -> None:  # type: ignore[no-untyped-def]
    for d in draws:
        sc = d.scenario
        assert isinstance(sc, Scenario) and sc.name == f"random-{d.seed}"
        cat = sc.catalog
        sizes = [cat.model(t.model).params_b for t in sc.tiers]
        assert 2 <= len(sizes) <= 4 and all(b >= 1.5 * a for a, b in zip(sizes, sizes[1:], strict=False))
        assert [t.quality_model for t in sc.tiers] == [WEAK] * (len(sizes) - 1) + [STRONG]
        assert 2 <= len(sc.cluster.gpus) <= 4 and all(n >= 2 for n in sc.cluster.gpus.values())
        inventory = sum(sc.price(g) * n for g, n in sc.cluster.gpus.items())
        assert 0 < sc.cluster.budget_per_hour <= inventory + 0.01
        assert LOAD_RANGE[0] <= d.load <= LOAD_RANGE[1]
        assert sc.workload.rate_rps == pytest.approx(d.load * d.capacity_rps, rel=1e-3)
        assert 60.0 <= sc.workload.duration_s <= 1800.0 and sc.targets.p95_latency_s > 0
        assert 0.0 < sc.targets.quality_floor < 1.0
        space = Space.build(sc)  # every tier can be deployed on some GPU type within the budget
        assert {p.tier for p in space.pairs} == set(range(len(sc.tiers)))


def test_the_draw_is_a_pure_function_of_the_seed(draws) -> None:  # type: ignore[no-untyped-def]
    for d in draws[:6]:
        again = draw_scenario(d.seed)
        assert again.scenario.model_dump() == d.scenario.model_dump() and again == d
        assert random_scenario(d.seed).model_dump() == d.scenario.model_dump()
    assert len({d.scenario.model_dump_json() for d in draws}) == len(draws)
    with pytest.raises(ValueError, match="seed"):
        draw_scenario(-1)


def test_the_draws_cover_their_ranges(draws) -> None:  # type: ignore[no-untyped-def]
    assert {d.shape for d in draws} == set(SHAPES)
    assert {d.arrivals for d in draws} == set(ARRIVALS)
    assert {len(d.scenario.tiers) for d in draws} == {2, 3, 4}
    assert any(d.prefill_heavy for d in draws) and not all(d.prefill_heavy for d in draws)
    assert min(d.load for d in draws) < 0.35 and max(d.load for d in draws) > 0.8
    gamma = [d.arrival_cv for d in draws if d.arrivals == "gamma"]
    assert min(gamma) >= 1.5 and max(gamma) <= 3.0
    # prompt-heavy and answer-heavy shapes both occur, from tens to thousands of tokens
    ratios = [d.mean_input / d.mean_output for d in draws]
    assert min(ratios) < 0.5 and max(ratios) > 50
    assert min(d.mean_input for d in draws) < 150 and max(d.mean_input for d in draws) > 2000
    assert len({g for d in draws for g in d.scenario.cluster.gpus}) >= 12
    assert any(t.dtype == "fp8" for d in draws for t in d.scenario.tiers)
