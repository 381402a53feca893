"""The simulator balances by the gateway's cache-aware rule where the plan's affinity is in force
(boute/sim/balance.py over boute/sim/affinity.py): the keys it derives from token segments, what it does to
a conversation workload's hits, and that its decisions are the rule's own on the same keys and loads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boute.sim import simulate
from boute.sim.affinity import (
    BOUNDED,
    IMBALANCE,
    NEW_PREFIX,
    REASONS,
    SHORT_MATCH,
    AffinityIndex,
    block_tokens,
    path_keys,
)
from boute.sim.balance import AffinityBalancer
from boute.sim.replica import SimReplica
from boute.specs import Plan
from boute.specs.balancing import Affinity
from boute.specs.scenario import Scenario
from boute.workload import Workload, build_workload
from tests.prefixed import with_prefixes

SMALL = {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090"}


def _plan(count: int, affinity: dict[str, Any] | None, extra: list[dict[str, Any]] | None = None) -> Plan:
    data: dict[str, Any] = {
        "routing": {"mode": "preroute", "tiers": ["small"], "fractions": [1.0], "scorer": "length"}
        | {"reference": "builtin:gsm8k"},
        "deployment": [{**SMALL, "count": count}, *(extra or [])],
    }
    if affinity is not None:
        data["affinity"] = affinity
    return Plan.model_validate(data)


@pytest.fixture(scope="module")
def conversations(poisson_scenario: Scenario) -> tuple[Scenario, Workload]:
    """Four-turn conversations with no system prompt: every shared token is an earlier turn's."""
    sc = with_prefixes(poisson_scenario, {"conversations": {"turns": 4, "think_s": 5}}, rate_rps=10, duration_s=60)
    return sc, build_workload(sc)


def _homes(w: Workload, replica: np.ndarray, previous: dict[int, int]) -> dict[int, set[int]]:
    """Each follow-up -> the replicas that served its previous turn's prompt before it arrived, alone or as the
    start of a longer prompt: that turn's, and those of other conversations that opened with the same prompt
    (equal texts are one segment)."""
    p = w.prefixes
    assert p is not None

    def passes(k: int, node: int) -> bool:
        at = int(p.prompt_node[k])
        while at >= 0 and at != node:
            at = int(p.parent[at])
        return at == node

    return {i: {int(replica[k]) for k in range(i) if passes(k, int(p.prompt_node[j]))} for i, j in previous.items()}


def _previous_turn(w: Workload) -> dict[int, int]:
    """Each follow-up request -> the request of its conversation's previous turn."""
    p = w.prefixes
    assert p is not None
    last: dict[tuple[int, int], int] = {
        (int(c), int(t)): i for i, (c, t) in enumerate(zip(p.conversation, p.turn, strict=True))
    }
    return {i: last[(int(p.conversation[i]), int(p.turn[i]) - 1)] for i in np.flatnonzero(p.turn > 1)}


# ---- keys -------------------------------------------------------------------------------------------------
def _tokens(path: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """A path as its tokens, each named by (segment, position in it): equal names, equal tokens."""
    return [(node, j) for node, t in path for j in range(t)]


@settings(max_examples=150, deadline=None)
@given(
    parents=st.lists(st.integers(-1, 30), min_size=2, max_size=30),
    lengths=st.lists(st.integers(1, 90), min_size=30, max_size=30),
    block_chars=st.sampled_from([16, 40, 64, 256]),
    max_blocks=st.integers(1, 12),
    data=st.data(),
)
def test_two_prompts_share_their_first_d_keys_exactly_when_they_share_those_tokens(
    parents: list[int], lengths: list[int], block_chars: int, max_blocks: int, data: st.DataObject
) -> None:
    """The chained text keys' property, for token paths: key i equal exactly when the tokens through block i's
    end are equal, blocks of block_chars / 4 tokens, at most max_blocks, and ``chars`` in the index's units."""
    parent = [p if p < i else -1 for i, p in enumerate(parents)]  # a tree: parents come first

    def path(node: int) -> tuple[tuple[int, int], ...]:
        own = ((node, lengths[node]),)
        return own if parent[node] < 0 else path(parent[node]) + own

    s = Affinity(block_chars=block_chars, max_blocks=max_blocks)
    b = block_tokens(s)
    assert b == max(1, round(block_chars / 4))
    a, c = (path(data.draw(st.integers(0, len(parent) - 1))) for _ in range(2))
    ka, kc = path_keys(a, s), path_keys(c, s)
    ta, tc = _tokens(a), _tokens(c)
    head = min(len(ta), b * max_blocks)
    assert len(ka.keys) == -(-head // b) and ka.chars == round(head * block_chars / b)
    for i in range(min(len(ka.keys), len(kc.keys))):
        end_a, end_c = min((i + 1) * b, len(ta), b * max_blocks), min((i + 1) * b, len(tc), b * max_blocks)
        same = end_a == end_c and ta[:end_a] == tc[:end_c]
        assert (ka.keys[i] == kc.keys[i]) == same


# ---- what affinity does to a conversation workload ------------------------------------------------------------
def test_affinity_keeps_conversations_on_their_replica_and_hits_far_more(
    conversations: tuple[Scenario, Workload],
) -> None:
    """Least load scatters a conversation's turns over 4 replicas; with the gateway's rule (default figures)
    the cached share of prompt tokens about doubles, and every follow-up the rule sent by affinity is on the
    previous turn's replica, or on one that served the same first prompt for another conversation."""
    sc, w = conversations
    off = simulate(_plan(4, None), sc, w)
    on = simulate(_plan(4, {}), sc, w)
    assert off.affinity_reason is None and off.summary()["affinity_routed"] is None
    share_off, share_on = off.cached_share, on.cached_share
    assert share_off is not None and share_on is not None
    assert share_on > 1.8 * share_off
    assert on.affinity_reason is not None
    previous = _previous_turn(w)
    affine = [i for i in previous if REASONS[on.affinity_reason[i]] == "affinity"]
    assert len(affine) > len(previous) / 2
    homes = _homes(w, on.replica, previous)
    assert all(int(on.replica[i]) in homes[i] for i in affine)
    routed = on.summary()["affinity_routed"]
    assert sum(routed.values()) == len(w) and routed["new_prefix"] > 0


def test_every_next_turn_goes_to_the_previous_turns_replica_unless_the_tier_was_imbalanced(
    conversations: tuple[Scenario, Workload],
) -> None:
    """With blocks of 16 tokens (every first turn spans one) and no shortest match, a turn k + 1 matches turn
    k's prompt where that text was served (turn k's replica, or another conversation's with the same first
    prompt), so it goes there; only the imbalance fallback or the holder's bounded load sends it elsewhere
    (counted: a few; 22 of 454 here, all by the bound)."""
    sc, w = conversations
    on = simulate(_plan(4, {"block_chars": 64, "min_match": 0.0}), sc, w)
    assert on.affinity_reason is not None
    previous = _previous_turn(w)
    assert min(int(w.input_tokens[j]) for j in previous.values()) >= 16
    homes = _homes(w, on.replica, previous)
    moved = [i for i in previous if int(on.replica[i]) not in homes[i]]
    fell_back = [i for i in previous if REASONS[on.affinity_reason[i]] in (IMBALANCE, BOUNDED)]
    assert set(moved) <= set(fell_back)
    assert len(fell_back) <= len(previous) // 10
    assert not any(REASONS[on.affinity_reason[i]] in (NEW_PREFIX, SHORT_MATCH) for i in previous)


def test_an_off_section_and_no_section_simulate_alike(conversations: tuple[Scenario, Workload]) -> None:
    sc, w = conversations
    a, b = simulate(_plan(3, None), sc, w), simulate(_plan(3, {"enabled": False}), sc, w)
    np.testing.assert_array_equal(a.replica, b.replica)
    np.testing.assert_array_equal(a.e2e_s, b.e2e_s)
    assert b.affinity_reason is None


# ---- the simulator's decisions are the rule's ---------------------------------------------------------------
Trace = list[tuple[int, int, list[int], int]]


def _traced(monkeypatch: pytest.MonkeyPatch) -> Trace:
    """Every affinity pick as (request, tier, outstanding per replica of the pool before, position chosen)."""
    trace: Trace = []
    pick = AffinityBalancer.pick

    def traced(self: AffinityBalancer, rid: int, tier: int, pool: list[SimReplica]) -> SimReplica:
        loads = [r.outstanding for r in pool]
        best = pick(self, rid, tier, pool)
        trace.append((rid, tier, loads, pool.index(best)))
        return best

    monkeypatch.setattr(AffinityBalancer, "pick", traced)
    return trace


def _replay(
    trace: Trace, w: Workload, route: np.ndarray, settings_: Affinity, weights: list[list[float]]
) -> list[tuple[int, str]]:
    """The same keys and loads through fresh indexes: each pick's position and reason, least load (the first
    fewest (outstanding + 1) / weight) where the rule defers."""
    indexes = [AffinityIndex(settings_) for _ in weights]
    paths = w.prefixes.paths(route) if w.prefixes is not None else None
    out = []
    for rid, tier, loads, _ in trace:
        path = paths.prompt(rid) if paths is not None else ((-1 - rid, int(w.input_tokens[rid])),)
        keys = path_keys(path, settings_)
        ws = weights[tier]
        mean = sum(ws) / len(ws)
        names = [str(j) for j in range(len(ws))]
        route = indexes[tier].choose(keys, names, loads, [x / mean for x in ws])
        j = route.choice
        if j is None:
            j = min(range(len(ws)), key=lambda k: ((loads[k] + 1) / ws[k], k))
        indexes[tier].record(keys.keys, names[j])
        out.append((j, route.reason))
    return out


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    rate=st.sampled_from([4.0, 12.0, 30.0]),
    prefixes=st.sampled_from(
        [
            None,
            {"conversations": {"turns": 3, "think_s": 2}},
            {"system_prompts": {"count": 3, "min_tokens": 50, "max_tokens": 400}, "conversations": {"turns": 2}},
        ]
    ),
    fast=st.integers(0, 2),
    block_chars=st.sampled_from([16, 64, 256]),
    max_blocks=st.integers(1, 8),
    min_match=st.sampled_from([0.0, 0.3, 0.9]),
    balance_abs=st.sampled_from([0.0, 1.0, 4.0, 32.0]),
    balance_rel=st.sampled_from([1.0, 1.5, 3.0]),
    index_blocks=st.sampled_from([16, 64, 65536]),
)
def test_the_simulators_picks_are_a_replay_of_the_rule(
    poisson_scenario: Scenario,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    rate: float,
    prefixes: dict[str, Any] | None,
    fast: int,
    block_chars: int,
    max_blocks: int,
    min_match: float,
    balance_abs: float,
    balance_rel: float,
    index_blocks: int,
) -> None:
    """Random small workloads, replica mixes (unequal weights) and figures: every placement the simulator made is
    the one :class:`AffinityIndex` makes on the same keys and outstanding counts, in the same order."""
    monkeypatch.undo()
    trace = _traced(monkeypatch)
    figures = {"block_chars": block_chars, "max_blocks": max_blocks, "min_match": min_match}
    figures |= {"balance_abs": balance_abs, "balance_rel": balance_rel, "index_blocks": index_blocks}
    extra = [{**SMALL, "gpu": "h100-sxm", "count": fast}] if fast else []
    plan = _plan(3, figures, extra)
    sc = with_prefixes(poisson_scenario, prefixes, rate_rps=rate, duration_s=15, seed=seed)
    w = build_workload(sc)
    res = simulate(plan, sc, w)
    assert len(trace) == len(w) and res.affinity_reason is not None
    weights = [[float(x) for x in res.replica_weight]]
    replayed = _replay(trace, w, res.tier, Affinity(**figures), weights)
    assert [j for *_, j in trace] == [j for j, _ in replayed]
    assert [REASONS[res.affinity_reason[rid]] for rid, *_ in trace] == [r for _, r in replayed]


def test_thresholds_that_always_see_imbalance_leave_every_unequal_pick_to_least_load(
    conversations: tuple[Scenario, Workload], monkeypatch: pytest.MonkeyPatch
) -> None:
    """balance_abs 0 and balance_rel 1: the tier is imbalanced whenever its loads differ at all, and then the
    pick is least load's exactly. At equal loads (an idle tier, or every replica as busy) nothing is imbalanced,
    so the rule's own choice stands there: no figures make the rule least load everywhere."""
    sc, w = conversations
    trace = _traced(monkeypatch)
    res = simulate(_plan(4, {"balance_abs": 0.0, "balance_rel": 1.0}), sc, w)
    assert res.affinity_reason is not None
    unequal = 0
    for rid, _, loads, j in trace:
        if len(set(loads)) > 1:  # equal weights: unequal loads
            unequal += 1
            assert REASONS[res.affinity_reason[rid]] == IMBALANCE
            assert j == min(range(len(loads)), key=lambda k: (loads[k], k))
        else:
            assert REASONS[res.affinity_reason[rid]] != IMBALANCE
    assert unequal > len(trace) / 2
