"""The screens (issue 12): routing moved onto the quality floor, plans over the capacity bound never evaluated.

The capacity bound is checked against the real fast path: a plan the evaluator finds stable must never be
screened out (the bound is an upper bound on what replicas can serve), on the built-in scenario and a
prefill-heavy one, where the prefill side of the bound is what binds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from boute.optimize.loop import LoopHooks, run_search
from boute.optimize.screen import Screen
from boute.optimize.settings import SearchSettings
from boute.optimize.space import Space
from boute.optimize.status import TrialStatus
from boute.specs import load_scenario
from tests.optimize_synthetic import SyntheticEvaluator

PREFILL = Path(__file__).parent / "scenarios" / "prefill-heavy.yaml"


@pytest.fixture(scope="module")
def builtin():
    from boute.optimize.evaluators import FastEvaluator

    sc = load_scenario(None)
    sp = Space.build(sc)
    ev = FastEvaluator(sc)
    return sp, ev, Screen.build(sp, ev.quality_model)


def test_projection_lands_on_the_floor_region_and_leaves_the_rest_alone(builtin) -> None:
    sp, _, scr = builtin
    floor = sp.scenario.targets.quality_floor
    rng = np.random.default_rng(0)
    moved = 0
    for _ in range(300):
        x = rng.random(sp.dim)
        xp, did = scr.project(x)
        assert scr.quality(sp._fractions(xp)) >= floor - 1e-12
        assert np.array_equal(xp[sp.n_routing :], x[sp.n_routing :])  # only routing moves
        if did:
            moved += 1
            # the least move: a little less towards the best tier would be below the floor
            fr, fb = sp._fractions(x), sp._fractions(xp)
            back = fb - 0.01 * (fb - fr)
            assert scr.quality(back) < floor or np.allclose(back, fb, atol=1e-3)
        else:
            assert np.array_equal(xp, x)
    assert 0 < moved < 300


def test_projection_is_the_same_with_its_cache_and_shared_by_plans_with_one_routing(builtin) -> None:
    """The cache on the routing dims returns what a fresh screen computes, and a point that differs only in its
    deployment gets the same routing."""
    sp, ev, scr = builtin
    rng = np.random.default_rng(3)
    n = sp.n_routing
    for _ in range(100):
        x = rng.random(sp.dim)
        y = x.copy()
        y[n:] = rng.random(sp.dim - n)  # another deployment, the same routing
        for z in (x, y, x):
            zp, did = scr.project(z)
            u, did_u = scr._project_routing(z[:n])  # computed afresh, not through the cache
            assert did == did_u and np.array_equal(zp[:n], u if did else z[:n]) and np.array_equal(zp[n:], z[n:])
        assert np.array_equal(scr.project(x)[0][: sp.n_routing], scr.project(y)[0][: sp.n_routing])


def test_admit_remembers_its_verdicts_and_still_counts_each_point(builtin) -> None:
    """A point admitted again gets what a fresh screen says of it (projection, plan, reason), and each
    admission is counted, remembered or not."""
    sp, ev, _ = builtin
    scr = Screen.build(sp, ev.quality_model)
    fresh = Screen.build(sp, ev.quality_model)
    rng = np.random.default_rng(5)
    xs = [rng.random(sp.dim) for _ in range(60)]
    for x in [*xs, *xs[::-1]]:
        xp, cand, why = scr.admit(x.copy(), pool=True)
        fresh._admitted.clear()
        xf, cf, wf = fresh.admit(x, pool=True)
        assert np.array_equal(xp, xf) and cand == cf and why == wf
    assert scr.pool == fresh.pool and scr.pool.seen == 120
    assert len(scr._admitted) == 60 and scr.search.seen == 0


def _assert_bound_holds(sp: Space, ev, scr: Screen, n: int) -> tuple[int, int]:
    rng = np.random.default_rng(1)
    removed = stable = 0
    for _ in range(n):
        cand = sp.decode(rng.random(sp.dim))
        why = scr.overload(cand)
        res = ev(cand)
        stable += bool(res.extra.stable)
        if why is not None:
            removed += 1
            assert not res.extra.stable, f"screened a plan the fast path finds stable: {why}"
    return removed, stable


def test_capacity_bound_never_removes_a_plan_the_fast_path_can_carry(builtin) -> None:
    sp, ev, scr = builtin
    removed, stable = _assert_bound_holds(sp, ev, scr, 400)
    assert removed > 50 and stable > 0  # it does real work: a good share of random plans is overloaded


def test_capacity_bound_holds_on_a_prefill_heavy_workload() -> None:
    from boute.optimize.evaluators import FastEvaluator

    sc = load_scenario(PREFILL)
    sp = Space.build(sc)
    ev = FastEvaluator(sc)
    scr = Screen.build(sp, ev.quality_model)
    assert scr.mean_input > 1000 > scr.mean_output  # prefill-bound
    removed, _ = _assert_bound_holds(sp, ev, scr, 300)
    assert removed > 0


def test_screened_trials_cost_no_evaluation_and_are_recorded() -> None:
    from boute.optimize.strategies.random import RandomStrategy

    sc = load_scenario(None)
    sp = Space.build(sc)
    ev = SyntheticEvaluator(sc)
    scr = Screen.build(sp, ev.quality_model)
    seen: list = []
    trials = run_search(
        sp,
        ev,
        RandomStrategy(sp, seed=4),
        SearchSettings(max_evals=30, batch=1, patience=None),
        screen=scr,
        hooks=LoopHooks(on_trial=seen.append),
    )
    evaluated = [t for t in trials if t.evaluated]
    screened = [t for t in trials if t.status == TrialStatus.SCREENED]
    assert len(evaluated) == 30 == ev.calls + sum(bool(t.result and t.result.extra.cached) for t in evaluated)
    assert screened and all(t.result is None and t.error for t in screened)
    assert {t.error.split(":")[0] for t in screened} <= {"capacity", "quality"}
    assert [t.index for t in trials] == list(range(len(trials))) and seen == trials
    # every screened x is exactly what random search owed that index: resuming replays the same history
    for t in trials:
        assert np.allclose(t.x, np.random.default_rng([4, t.index]).random(sp.dim))
    c = scr.search
    assert c.seen == len(trials) and c.capacity + c.quality == len(screened)
    for t in evaluated:  # what was evaluated passed both screens
        assert scr.quality(t.candidate.fractions) >= sc.targets.quality_floor - 1e-12
        assert scr.overload(t.candidate) is None
    # resume: the same 30 + 10 more, none lost or repeated
    more = run_search(
        sp,
        ev,
        RandomStrategy(sp, seed=4),
        SearchSettings(max_evals=40, batch=1, patience=None),
        trials=trials,
        screen=scr,
    )
    assert more[: len(trials)] == trials and sum(t.evaluated for t in more) == 40


def test_without_an_exact_quality_model_only_capacity_is_screened() -> None:
    sc = load_scenario(None)
    sp = Space.build(sc)
    scr = Screen.build(sp, None)
    x = np.zeros(sp.dim)  # everything to the small tier: below the floor, but nothing is known about quality
    xp, moved = scr.project(x)
    assert not moved and np.array_equal(xp, x)
    assert np.allclose(scr.visits((0.3, 0.7)), (0.3, 0.7))
