"""Workloads whose prompts share prefixes (boute/workload/prefixes.py) and the simulator's prefix cache
(boute/sim/replica.py with boute/perf/prefix_cache.py): what is drawn, what hits, and what a hit saves."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from boute.errors import SpecError
from boute.sim import simulate
from boute.specs import Plan
from boute.specs.scenario import Scenario
from boute.workload import build_workload
from tests.prefixed import with_prefixes

SMALL = {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090"}


def _plan(count: int) -> Plan:
    return Plan.model_validate(
        {
            "routing": {"mode": "preroute", "tiers": ["small"], "fractions": [1.0], "scorer": "length"}
            | {"reference": "builtin:gsm8k"},
            "deployment": [{**SMALL, "count": count}],
        }
    )


@pytest.fixture(scope="module")
def base(poisson_scenario: Scenario) -> Scenario:
    return poisson_scenario


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_conversations_repeat_the_previous_turn_and_its_answer(base: Scenario, seed: int) -> None:
    spec = {"system_prompts": {"count": 5, "min_tokens": 200, "max_tokens": 900}, "conversations": {"turns": 3}}
    sc = with_prefixes(base, spec, seed=seed, rate_rps=20, duration_s=120)
    w = build_workload(sc)
    p = w.prefixes
    assert p is not None
    paths = p.paths()
    for i in range(len(w)):
        path = paths.prompt(i)
        assert sum(t for _, t in path) == w.input_tokens[i] <= sc.workload.lengths.max_input
        assert path[0][0] < 5  # every conversation opens with one of the system prompts
    follow = np.flatnonzero(p.turn > 1)
    assert len(follow) > len(w) // 4 and p.turn.max() <= 3
    for i in follow:
        prev = np.flatnonzero((p.conversation == p.conversation[i]) & (p.turn == p.turn[i] - 1))
        assert len(prev) == 1 and w.arrival_s[prev[0]] <= w.arrival_s[i]
        # turn k + 1 starts with turn k's prompt and its answer, as it was recorded
        assert p.prompt_node[p.previous(int(i))] == p.prompt_node[prev[0]]  # that turn, or the same text's first
        before = paths.full(int(prev[0]), 0, int(w.output_tokens[prev[0]]))
        assert paths.prompt(i)[: len(before)] == before
        assert before[-1][1] == w.output_tokens[prev[0]]
    # the popular system prompt opens more conversations than the least popular (zipf 1.1 over 5)
    first = np.bincount([paths.prompt(i)[0][0] for i in range(len(w)) if p.turn[i] == 1], minlength=5)
    assert first[0] > first[4]


def test_a_workload_without_prefixes_is_drawn_as_before(base: Scenario) -> None:
    plain = build_workload(base)
    with_sp = build_workload(with_prefixes(base, {"system_prompts": {"count": 3}}))
    assert plain.prefixes is None
    np.testing.assert_array_equal(plain.arrival_s, with_sp.arrival_s)
    np.testing.assert_array_equal(plain.output_tokens, with_sp.output_tokens)
    p = with_sp.prefixes
    assert p is not None
    own = p.tokens[p.prompt_node]
    np.testing.assert_array_equal(own, plain.input_tokens)  # the drawn prompt is the new text after the system prompt
    # a profile prompt drawn again after the same system prompt is the same text: one node
    pairs = {(int(p.parent[node]), int(r)) for node, r in zip(p.prompt_node, plain.prompt_index, strict=True)}
    assert len(np.unique(p.prompt_node)) == len(pairs) < len(plain)


@pytest.mark.parametrize("replicas", [1, 3])
def test_hits_skip_prefill_and_nothing_else_changes(base: Scenario, replicas: int) -> None:
    """The same requests with and without the cache: hits are at most the shared tokens, every completed
    request is as long, and the replicas spend less time in prefill, so first tokens come sooner."""
    sc = with_prefixes(base, {"system_prompts": {"count": 4, "min_tokens": 1000, "max_tokens": 2500}}, rate_rps=8)
    w = build_workload(sc, duration_s=90)
    cached = simulate(_plan(replicas), sc, w)
    blind = simulate(_plan(replicas), sc, replace(w, prefixes=None))
    assert blind.cached_tokens is None and blind.summary()["cached_token_share"] is None
    hits = cached.cached_tokens
    assert hits is not None
    assert np.all(hits <= w.input_tokens - 1)  # the last prompt token is always computed
    share = cached.summary()["cached_token_share"]
    assert 0.5 < share <= 1.0 - w.prefixes.least_prefill() / w.input_tokens.mean()  # type: ignore[union-attr]
    assert cached.summary()["completed"] == blind.summary()["completed"] == len(w)
    assert cached.replica_busy_s.sum() < blind.replica_busy_s.sum()
    assert np.median(cached.ttft_s) < 0.7 * np.median(blind.ttft_s)


def test_a_small_kv_pool_evicts_and_hits_less(base: Scenario) -> None:
    """Twenty system prompts of ~3k tokens (60k) do not fit in a 4090 replica's pool (8B bf16: ~39k KV
    tokens), less what its running requests hold; an H100's (~443k) keeps them all, so it hits far more."""
    spec = {"system_prompts": {"count": 20, "min_tokens": 2500, "max_tokens": 3500, "zipf": 0.0}}
    sc = with_prefixes(base, spec, rate_rps=6)
    w = build_workload(sc, duration_s=120)
    small = simulate(_plan(1), sc, w).summary()["cached_token_share"]
    big_plan = Plan.model_validate({**_plan(1).model_dump(), "deployment": [{**SMALL, "gpu": "h100-sxm", "count": 1}]})
    big = simulate(big_plan, sc, w).summary()["cached_token_share"]
    assert small < 0.7 < 0.9 < big


@pytest.mark.parametrize(
    ("prefixes", "field"),
    [
        ({"system_prompts": {"min_tokens": 900, "max_tokens": 800}}, "max_tokens"),
        ({"system_prompts": {"max_tokens": 9000}}, "max_input"),
        ({"conversations": {"turns": 0}}, "turns"),
        ({"system_prompts": {"zipf": -1}}, "zipf"),
        ({"convos": {}}, "convos"),
    ],
)
def test_a_bad_prefix_section_names_its_field(base: Scenario, prefixes: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError, match=field) as err:
        with_prefixes(base, prefixes)
    assert "scenario.yaml" in str(err.value) and "prefixes" in str(err.value)


def test_an_earlier_answer_hits_only_on_a_replica_of_the_tier_that_gave_it(base: Scenario) -> None:
    """Turn 2 repeats the answer its client got from turn 1's tier: served by that tier's replica it hits turn
    1's prompt and answer; sent to the other tier, whose model answered nothing of it, it hits nothing."""
    sc = with_prefixes(base, {"conversations": {"turns": 2, "think_s": 2.0}}, rate_rps=2)
    w = build_workload(sc, duration_s=120)
    p = w.prefixes
    assert p is not None
    plan = Plan.model_validate(
        {
            "routing": {"mode": "preroute", "tiers": ["small", "large"], "fractions": [0.5, 0.5], "scorer": "length"}
            | {"reference": "builtin:gsm8k"},
            "deployment": [{**SMALL, "count": 1}, {**SMALL, "tier": "large", "count": 1}],
        }
    )
    second = p.turn == 2
    same = np.zeros(len(w), dtype=np.int64)  # both turns on the small tier
    crossed = np.where(second, 1, 0).astype(np.int64)  # turn 1 small, turn 2 large
    hit_same = simulate(plan, sc, w, route=same).cached_tokens
    hit_crossed = simulate(plan, sc, w, route=crossed).cached_tokens
    assert hit_same is not None and hit_crossed is not None
    history = w.input_tokens - p.tokens[p.prompt_node]
    prev = np.asarray([p.previous(i) for i in range(len(w))])
    # turn 1 finished before turn 2 arrived: its prompt and answer; only prefilled by then: its prompt
    whole, prompt_only = hit_same == history, hit_same == np.where(prev >= 0, w.input_tokens[prev], -1)
    assert np.all((whole | prompt_only)[second]) and whole[second].sum() > second.sum() // 2
    # the large tier serves only turns 2: a history it has not served before (another conversation with the
    # same first prompt has the same history text) hits nothing there
    history_node = p.parent[p.prompt_node]
    first_seen = np.zeros(len(w), dtype=bool)
    first_seen[np.unique(np.where(second, history_node, -2), return_index=True)[1]] = True
    assert (first_seen & second).sum() > second.sum() // 2
    assert hit_crossed[first_seen & second].sum() == 0 and hit_crossed[~second].sum() == hit_same[~second].sum()
