"""The search space: every point of the box decodes to a plan that meets every hard limit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boute.errors import InfeasibleError
from boute.optimize.plan_run import with_targets
from boute.optimize.repair import fit_budget, fit_inventory
from boute.optimize.space import Space, is_valid
from boute.specs import Plan, Routing, load_scenario


def _three_tier():
    sc = load_scenario(None)
    data = sc.model_dump(mode="json")
    data["tiers"] = [
        {"name": "s", "model": "llama-3.2-3b"},
        {"name": "m", "model": "llama-3.1-8b"},
        {"name": "l", "model": "llama-3.1-70b"},
    ]
    data["cluster"] = {"gpus": {"h100-sxm": 4, "rtx-4090": 6, "rtx-5090": 3}, "budget_per_hour": 17.5}
    from boute.specs import Scenario

    return Scenario.model_validate(data)


SPACES = {
    "builtin": lambda: Space.build(load_scenario(None)),
    "three-tier": lambda: Space.build(_three_tier()),
    "tight-budget": lambda: Space.build(with_targets(load_scenario(None), 6.0, None, None)),
    "one-gpu": lambda: Space.build(load_scenario(None), gpus=("rtx-pro-6000",)),
}
_built: dict[str, Space] = {}


def space(name: str) -> Space:
    if name not in _built:
        _built[name] = SPACES[name]()
    return _built[name]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(SPACES)), data=st.data())
def test_every_decoded_candidate_is_feasible(name: str, data: st.DataObject) -> None:
    sp = space(name)
    x = np.array(data.draw(st.lists(st.floats(0, 1), min_size=sp.dim, max_size=sp.dim)))
    cand = sp.decode(x)
    assert is_valid(sp, cand) is None
    # the plan file built from it passes the spec's own checks (routing only to deployed tiers)
    Plan(
        routing=Routing(
            tiers=[t.name for t in sp.scenario.tiers],
            fractions=list(cand.fractions),
            scorer="length",  # a split needs a named scorer; the length one needs no trained router file
            reference=sp.scenario.quality.profile,
        ),
        deployment=list(cand.deployment),
    )
    # the canonical point decodes to the same plan without any repair
    z = sp.encode(cand)
    assert sp.decode(z).key() == cand.key()
    assert np.all((z >= 0) & (z <= 1))


def test_corners_of_the_box_are_feasible() -> None:
    for name in SPACES:
        sp = space(name)
        for x in (np.zeros(sp.dim), np.ones(sp.dim), np.full(sp.dim, 0.5)):
            assert is_valid(sp, sp.decode(x)) is None


def test_full_box_respects_budget_and_inventory() -> None:
    sp = space("builtin")
    cand = sp.decode(np.ones(sp.dim))  # asks for every GPU for every tier
    assert cand.cost_per_hour <= sp.budget + 1e-9
    assert cand.cost_per_hour > 0.8 * sp.budget  # repair trims, it does not throw the plan away


def test_discrete_and_categorical_dims_cover_the_placement_part() -> None:
    sp = space("builtin")
    dims = set(sp.discrete_dims()) | set(sp.categorical_dims())
    assert dims == set(sp.placement_dims())
    assert sp.routing_dims() == [0]


def test_budget_too_small_for_any_replica_is_a_clear_error() -> None:
    sc = with_targets(load_scenario(None), 0.1, None, None)
    with pytest.raises(InfeasibleError, match=r"\$0.1/h"):
        Space.build(sc)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_tier_off_neighbours_drop_exactly_one_tier(data: st.DataObject) -> None:
    """Each tier-off neighbour decodes to a valid plan with exactly one loaded tier fewer, that tier undeployed,
    and its share added to a tier that was loaded already; the other shares are unchanged."""
    from boute.optimize.acquisition.pool import tier_off_neighbours

    sp = space("three-tier")
    x = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=sp.dim, max_size=sp.dim)))
    z = sp.canonical(x)
    base = sp.decode(z)
    loaded = {t for t, f in enumerate(base.fractions) if f > 0}
    names = [t.name for t in sp.scenario.tiers]
    got = tier_off_neighbours(sp, z)
    expected = sum((t > min(loaded)) + (t < max(loaded)) for t in loaded)
    assert len(got) == expected
    for y in got:
        cand = sp.decode(y)
        assert is_valid(sp, cand) is None
        now = {t for t, f in enumerate(cand.fractions) if f > 0}
        assert now < loaded
        dropped = loaded - now
        assert len(dropped) == 1
        (off,) = dropped
        assert names[off] not in {g.tier for g in cand.deployment}
        gain = {t: cand.fractions[t] - base.fractions[t] for t in now}
        assert all(
            np.isclose(g, 0.0, atol=1e-9) or np.isclose(g, base.fractions[off], atol=1e-9) for g in gain.values()
        )
        assert np.isclose(sum(gain.values()), base.fractions[off], atol=1e-9)


def test_stick_breaking_residue_is_no_load() -> None:
    """Shares that sum to 1 only up to round-off, such as a tier's load moved onto its neighbour, encode to a
    ``u`` a hair below 1, whose decode would leave ~1e-17 of the load on the last tier and buy that tier a paid
    replica. Decoded shares are exactly 0 or above ``SHARE_EPS``, and the emptied tier stays undeployed."""
    from boute.optimize.space import SHARE_EPS

    sp = space("three-tier")
    last = sp.scenario.tiers[-1].name
    rng = np.random.default_rng(7)
    residue = 0
    for _ in range(2000):
        a, b, c = rng.dirichlet(np.ones(3))
        z = np.zeros(sp.dim)
        z[sp.n_routing :] = rng.uniform(size=sp.dim - sp.n_routing)
        for p in sp.pairs:
            if p.tier == 2:
                z[p.count_dim] = 0.0
        z[: sp.n_routing] = sp.routing_point((a, b + c, 0.0))
        residue += 0.0 < 1.0 - z[0] - (1.0 - z[0]) * z[1] <= SHARE_EPS
        cand = sp.decode(z)
        assert all(f == 0.0 or f > SHARE_EPS for f in cand.fractions)
        assert cand.fractions[2] == 0.0
        assert last not in {g.tier for g in cand.deployment}
    assert residue > 0  # the draw does reach the round-off case this test is about


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["builtin", "three-tier"]), data=st.data())
def test_swap_neighbours_exchange_one_replica(name: str, data: st.DataObject) -> None:
    """Each swap neighbour re-shards a deployed group to one of its configs on the same GPUs and gives up one
    replica of it, and adds one replica to another group (at its config if deployed, each config if not).
    Where that exchanged plan fits the budget and the inventory and still serves every loaded tier, the
    neighbour decodes to exactly it, routing unchanged; every neighbour decodes to a valid plan."""
    from boute.optimize.acquisition.pool import swap_neighbours

    sp = space(name)
    x = np.array(data.draw(st.lists(st.floats(0.0, 1.0), min_size=sp.dim, max_size=sp.dim)))
    z = sp.canonical(x)
    base = sp.decode(z)
    names = [t.name for t in sp.scenario.tiers]
    groups = {(g.tier, g.gpu): g for g in base.deployment}
    got = iter(swap_neighbours(sp, z))
    for src in sp.pairs:
        s_key = (names[src.tier], src.gpu)
        if s_key not in groups:
            continue
        for cs in src.configs:
            for dst in sp.pairs:
                if dst is src:
                    continue
                d_key = (names[dst.tier], dst.gpu)
                dg = groups.get(d_key)
                for cd in (
                    dst.configs if dg is None else [next(c for c in dst.configs if (c.tp, c.pp) == (dg.tp, dg.pp))]
                ):
                    cand = sp.decode(next(got))
                    assert is_valid(sp, cand) is None
                    # the exchanged plan, built from the deployment (not from the encoding)
                    want = {k: (g.count, g.tp, g.pp) for k, g in groups.items()}
                    want[s_key] = (groups[s_key].gpus_used // cs.gpus - 1, cs.tp, cs.pp)
                    n = want.get(d_key, (0,))[0]
                    want[d_key] = (n + 1, cd.tp, cd.pp)
                    want = {k: v for k, v in want.items() if v[0] > 0}
                    cost = sum(n * t * p * sp.scenario.price(k[1]) for k, (n, t, p) in want.items())
                    used: dict[str, int] = {}
                    for k, (n, t, p) in want.items():
                        used[k[1]] = used.get(k[1], 0) + n * t * p
                    fits = (
                        cost <= sp.budget + 1e-9
                        and all(u <= sp.inventory[g] for g, u in used.items())
                        and all(names[t] in {k[0] for k in want} for t, f in enumerate(base.fractions) if f > 0)
                    )
                    if fits:
                        assert {(g.tier, g.gpu): (g.count, g.tp, g.pp) for g in cand.deployment} == want
                        assert np.allclose(cand.fractions, base.fractions, atol=1e-12)
    assert next(got, None) is None  # no neighbour beyond those


def _greedy_reference(space: Space, x: np.ndarray) -> tuple[list[int], list[tuple[int, int]]]:
    """Repairs (1) and (2) one replica at a time in plain Python, as they were written first: the rule the
    vectorised repair must keep, ties included."""
    x = np.clip(x, 0.0, 1.0)
    cfg = [p.configs[p.config_index(x)] for p in space.pairs]
    reps = [int(round(x[p.count_dim] * p.inventory)) // c.gpus for p, c in zip(space.pairs, cfg, strict=True)]
    pairs = space.pairs
    for g, inv in space.inventory.items():
        idx = [i for i, p in enumerate(pairs) if p.gpu == g]
        while sum(reps[i] * cfg[i].gpus for i in idx) > inv:
            i = max(idx, key=lambda i: (reps[i] * cfg[i].gpus, -i))
            reps[i] -= 1
    while sum(r * c.gpus * p.price for p, c, r in zip(pairs, cfg, reps, strict=True)) > space.budget + 1e-9:
        per_tier = [sum(r for p, r in zip(pairs, reps, strict=True) if p.tier == t) for t in range(len(pairs))]
        live = [i for i in range(len(pairs)) if reps[i] > 0]
        spare = [i for i in live if per_tier[pairs[i].tier] > 1]
        i = max(spare or live, key=lambda i: (reps[i] * cfg[i].gpus * pairs[i].price, -i))
        reps[i] -= 1
    return reps, [(c.tp, c.pp) for c in cfg]


@pytest.mark.parametrize(
    "scenario", ["experiments/scenarios/fleet-8x60.yaml", "experiments/scenarios/scaling-6x48.yaml"]
)
def test_the_vectorised_repair_takes_the_replicas_the_one_at_a_time_greedy_takes(scenario: str) -> None:
    space = Space.build(load_scenario(scenario))
    tiers = {space.scenario.tiers[p.tier].name for p in space.pairs}
    rng = np.random.default_rng(11)
    compared = 0
    for x in rng.random((300, space.dim)) ** rng.choice([1.0, 3.0], size=(300, 1)):
        reps, cfg = _greedy_reference(space, x)
        want = {
            (p.gpu, space.scenario.tiers[p.tier].name, tp, pp, r)
            for p, (tp, pp), r in zip(space.pairs, cfg, reps, strict=True)
            if r > 0
        }
        if {w[1] for w in want} != tiers:
            continue  # a tier left without replicas: repair (3) adds one, which is not compared here
        assert {(g.gpu, g.tier, g.tp, g.pp, g.count) for g in space.decode(x).deployment} == want
        compared += 1
    assert compared > 100


def test_the_repair_keeps_the_greedys_ties_on_arrays_full_of_them() -> None:
    """The heap-based repairs against the one-at-a-time greedy on random arrays whose spends tie often
    (small integer prices and GPU counts, few tiers, tiers down to their last replica, budgets of zero)."""
    rng = np.random.default_rng(5)
    for _ in range(3000):
        n, n_tiers = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        r = rng.integers(0, 6, size=n).astype(np.int64)
        gpus = rng.choice([1, 2, 4], size=n).astype(np.int64)
        price = rng.choice([0.5, 1.0, 2.0], size=n)
        tier = rng.integers(0, n_tiers, size=n).astype(np.int64)
        budget = float(rng.integers(0, 40))
        want = r.tolist()
        while sum(w * g * p for w, g, p in zip(want, gpus.tolist(), price.tolist(), strict=True)) > budget + 1e-9:
            per_tier = [sum(w for w, t in zip(want, tier.tolist(), strict=True) if t == k) for k in range(n_tiers)]
            live = [i for i in range(n) if want[i] > 0]
            spare = [i for i in live if per_tier[tier[i]] > 1]
            want[max(spare or live, key=lambda i: (want[i] * gpus[i] * price[i], -i))] -= 1
        got = r.copy()
        fit_budget(got, gpus, price, tier, n_tiers, budget)
        assert got.tolist() == want
        on = {"a": np.flatnonzero(tier == 0), "b": np.flatnonzero(tier != 0)}
        inventory = {"a": int(rng.integers(0, 12)), "b": int(rng.integers(0, 12))}
        want = r.tolist()
        for g, inv in inventory.items():
            idx = on[g].tolist()
            while sum(want[i] * gpus[i] for i in idx) > inv:
                want[max(idx, key=lambda i: (want[i] * gpus[i], -i))] -= 1
        got = r.copy()
        fit_inventory(got, gpus, on, inventory)
        assert got.tolist() == want
