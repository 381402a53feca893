"""Objectives (latency / cost / pareto): the choice rules, the 3-D front and hypervolume, and each objective
end to end on the synthetic evaluator (the real space, screens, MOBO, harness and tracking)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from boute.optimize.objectives import (
    OBJECTIVES,
    PREFERENCES,
    Objective,
    front_layers,
    knee_goodness,
    make_objective,
    nondominated,
)
from boute.optimize.settings import SearchSettings
from boute.optimize.trials import choose, hypervolume3, pareto_front
from boute.specs import Targets, load_scenario
from tests.optimize_synthetic import SyntheticEvaluator

TG = Targets(0.7, 10.0, 30.0)


def _brute_nondominated(Y: np.ndarray) -> np.ndarray:
    n = len(Y)
    return np.array(
        [not any(np.all(Y[j] <= Y[i]) and np.any(Y[j] < Y[i]) for j in range(n) if j != i) for i in range(n)]
    )


def test_nondominated_matches_brute_force_in_3d() -> None:
    rng = np.random.default_rng(7)
    Y = rng.integers(0, 5, size=(80, 3)).astype(float)  # many ties and duplicates
    assert np.array_equal(nondominated(Y), _brute_nondominated(Y))


@pytest.mark.parametrize("seed", range(5))
def test_front_layers_keeps_whole_layers_until_enough(seed: int) -> None:
    """The kept rows are whole non-dominated layers (peeled by brute force here), the fewest that reach
    ``min_rows``; every dropped row is dominated by a kept one."""
    rng = np.random.default_rng(seed)
    Y = np.concatenate([rng.normal(size=(150, 2)), rng.integers(0, 4, size=(30, 2)).astype(float)])
    layer = np.full(len(Y), -1)
    rest, k = np.arange(len(Y)), 0
    while rest.size:
        front = rest[_brute_nondominated(Y[rest])]
        layer[front] = k
        rest, k = np.setdiff1d(rest, front), k + 1
    for min_rows in (1, 10, 32, 100, len(Y) + 5):
        keep = front_layers(Y, min_rows)
        last = layer[keep].max()
        assert np.array_equal(keep, layer <= last)
        assert keep.sum() >= min(min_rows, len(Y)) > (layer < last).sum()
        for i in np.flatnonzero(~keep):
            assert any(np.all(Y[j] <= Y[i]) and np.any(Y[j] < Y[i]) for j in np.flatnonzero(keep))


def test_each_objective_picks_its_own_best_among_feasible_plans() -> None:
    q = np.array([0.75, 0.80, 0.72, 0.90, 0.71])
    p = np.array([4.0, 2.0, 9.0, 1.0, 3.0])
    c = np.array([20.0, 28.0, 12.0, 40.0, 18.0])  # the last but one is over budget: never chosen
    feas = TG.mask(q, p, c)
    assert Objective("latency").pick(q, p, c, feas, TG) == 1
    assert Objective("cost").pick(q, p, c, feas, TG) == 2
    assert Objective("pareto", "quality").pick(q, p, c, feas, TG) == 1
    assert Objective("pareto", "cost").pick(q, p, c, feas, TG) == 2
    assert Objective("pareto", "latency").pick(q, p, c, feas, TG) == 1
    assert Objective("cost").pick(q, p, c, np.zeros(5, bool), TG) is None


def test_pareto_never_picks_a_dominated_plan_and_knee_is_unit_free() -> None:
    rng = np.random.default_rng(3)
    q = rng.uniform(0.7, 0.9, 40)
    p = rng.uniform(0.5, 10.0, 40)
    c = rng.uniform(5.0, 30.0, 40)
    feas = np.ones(40, dtype=bool)
    front = nondominated(np.stack([-q, p, c], axis=1))
    for rule in PREFERENCES.names():
        i = Objective("pareto", rule).pick(q, p, c, feas, TG)
        assert front[i], rule
    # the knee does not depend on units: dollars as cents, seconds as ms (targets scaled alike)
    k = Objective("pareto", "knee").pick(q, p, c, feas, TG)
    k2 = Objective("pareto", "knee").pick(q, p * 1000, c * 100, feas, Targets(0.7, 10_000.0, 3000.0))
    assert k == k2
    g = knee_goodness(q[front], p[front], c[front], TG)
    assert np.all((g >= 0) & (g <= 1)) and np.allclose(g.max(axis=0), 1.0)


def test_order_starts_with_the_pick() -> None:
    rng = np.random.default_rng(5)
    q, p, c = rng.uniform(0.7, 0.9, 25), rng.uniform(1, 9, 25), rng.uniform(5, 29, 25)
    for obj in (Objective("latency"), Objective("cost"), Objective("pareto", "knee")):
        order = obj.order(q, p, c, TG)
        assert sorted(order) == list(range(25))
        assert order[0] == obj.pick(q, p, c, np.ones(25, bool), TG)


def test_hypervolume3_matches_a_monte_carlo_estimate() -> None:
    rng = np.random.default_rng(11)
    q = rng.uniform(0.7, 0.9, 12)
    p = rng.uniform(1.0, 10.0, 12)
    c = rng.uniform(5.0, 30.0, 12)
    hv = hypervolume3(q, p, c, TG)
    # sample the box between the reference point and the ideal corner; a sample counts when some plan dominates it
    lo = np.array([0.7, -np.log(10.0), -30.0])
    hi = np.array([q.max(), -np.log(p.min()), -c.min()])
    s = rng.uniform(lo, hi, size=(200_000, 3))
    Y = np.stack([q, -np.log(p), -c], axis=1)
    dom = np.zeros(len(s), dtype=bool)
    for y in Y:
        dom |= np.all(s <= y, axis=1)
    mc = dom.mean() * np.prod(hi - lo)
    assert hv == pytest.approx(mc, rel=0.02)
    assert hypervolume3(q, p * 100, c, TG) == 0.0  # nothing meets the cap: no volume


def test_make_objective_checks_names_against_the_registry() -> None:
    from boute.errors import BouteError

    assert make_objective("pareto").label == "pareto:knee"
    assert make_objective("pareto", "cost").label == "pareto:cost"
    with pytest.raises(BouteError, match="--objective: unknown objective 'speed'"):
        make_objective("speed")
    with pytest.raises(BouteError, match="--prefer: unknown rule 'cheap'"):
        make_objective("pareto", "cheap")


@pytest.fixture(scope="module")
def scenario():
    return load_scenario(None)


@pytest.mark.parametrize("objective", ["cost", "pareto"])
def test_search_chooses_by_the_objective_and_keeps_the_3d_front(scenario, objective: str, tmp_path) -> None:
    from boute.optimize.session import SearchRuntime, optimize
    from boute.tracking import open_store

    store = open_store(f"sqlite:///{tmp_path / 'o.db'}")
    try:
        out = optimize(
            scenario,
            SearchSettings(max_evals=24, objective=objective, seed=1, batch=1, workers=1),
            SearchRuntime(evaluator=SyntheticEvaluator(scenario), store=store),
        )
        tg = scenario.goal
        ok = [
            t
            for t in out.trials
            if t.ok and tg.met_by(t.result.quality, t.result.p95_latency_s, t.result.cost_per_hour)
        ]
        assert out.chosen is not None and ok
        if objective == "cost":  # the cheapest plan meeting the targets, whatever its P95
            assert out.chosen.result.cost_per_hour == min(t.result.cost_per_hour for t in ok)
        # the front: plans meeting the targets, none dominated in (quality, P95, $/h)
        assert out.front and all(t in ok for t in out.front)
        Y = np.array([[-t.result.quality, t.result.p95_latency_s, t.result.cost_per_hour] for t in ok])
        keys = {t.candidate.key() for t in out.front}
        assert keys == {t.candidate.key() for t, m in zip(ok, _brute_nondominated(Y), strict=True) if m}
        assert out.chosen in out.front and out.hypervolume > 0
        fr = store.fronts(out.experiment_id)[-1]
        assert fr.axes == "quality,p95_latency_s,cost_per_hour" and len(fr.points) == len(out.front)
        assert store.experiment(out.experiment_id).settings["objective"] == out.objective.label
    finally:
        store.close()


def test_latency_front_and_choice_are_unchanged(scenario) -> None:
    """The default objective keeps the (quality, P95) front of every plan and picks the lowest P95."""
    from boute.optimize.session import SearchRuntime, optimize

    out = optimize(
        scenario,
        SearchSettings(max_evals=20, seed=2, batch=1, workers=1),
        SearchRuntime(evaluator=SyntheticEvaluator(scenario)),
    )
    assert out.objective.label == "latency"
    chosen, _ = choose(out.trials, scenario.goal)
    assert chosen is out.chosen
    assert pareto_front(out.trials) == out.front


def test_mobo_cost_proposals_are_new_canonical_plans_that_pass_the_screens(scenario) -> None:
    from boute.optimize.loop import run_search
    from boute.optimize.screen import Screen
    from boute.optimize.space import Space
    from boute.optimize.strategies.mobo import MoboStrategy

    sp = Space.build(scenario)
    ev = SyntheticEvaluator(scenario)
    scr = Screen.build(sp, ev.quality_model)
    strat = MoboStrategy(sp, seed=0, n_init=6, objective="cost", pool_global=64, pool_local=96)
    trials = run_search(
        sp, ev, strat, SearchSettings(max_evals=12, objective="cost", batch=1, patience=None), screen=scr
    )
    evaluated = [t for t in trials if t.evaluated]
    assert len(evaluated) == 12 and len(strat.steps) == 6  # 6 Sobol points, then 6 BO steps
    bo = evaluated[6:]
    for t in bo:  # BO proposals come from the screened pool: canonical, new, above the floor, not overloaded
        assert np.allclose(sp.encode(sp.decode(np.array(t.x))), t.x)
        assert scr.quality(t.candidate.fractions) >= scenario.targets.quality_floor - 1e-12
        assert scr.overload(t.candidate) is None
    keys = [t.candidate.key() for t in evaluated]
    assert len(set(keys)) == len(keys)
    assert scr.pool.seen > 0 and scr.pool.capacity > 0  # the pool screen did remove overloaded plans


def test_nsga2_takes_the_objective(scenario) -> None:
    from boute.optimize.loop import run_search
    from boute.optimize.space import Space
    from boute.optimize.strategies.nsga2 import NSGA2Strategy

    sp = Space.build(scenario)
    for obj in ("cost", "pareto"):
        trials = run_search(
            sp,
            SyntheticEvaluator(scenario),
            NSGA2Strategy(sp, seed=1, objective=obj),
            SearchSettings(max_evals=26, batch=1, patience=None),
        )
        assert len(trials) == 26


def test_combinations_of_rules_are_all_registered() -> None:
    assert OBJECTIVES.names() == ["latency", "cost", "pareto"]
    assert PREFERENCES.names() == ["knee", "cost", "latency", "quality"]
    for name, rule in itertools.product(OBJECTIVES.names(), PREFERENCES.names()):
        assert make_objective(name, rule).name == name
