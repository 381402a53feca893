"""The prefix-affinity rule (boute.sim.affinity) on random loads and prefixes: its thresholds, its rendezvous
hashing's stability and bounded load, the index's bounds and forgetting."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter

import pytest
from pydantic import ValidationError

from boute.sim.affinity import (
    AFFINITY,
    BOUNDED,
    IMBALANCE,
    NEW_PREFIX,
    SHORT_MATCH,
    AffinityIndex,
    overloaded,
    prompt_keys,
    render_messages,
    rendezvous,
)
from boute.specs.balancing import Affinity
from boute.specs.plan import Plan
from tests.stack import TEST_PLAN

S = Affinity(block_chars=16, max_blocks=8)
NAMES = [f"replica-{i}" for i in range(5)]


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefgh ") for _ in range(n))


def test_keys_are_chained_bounded_and_the_same_in_another_process() -> None:
    a = prompt_keys("s" * 40 + "question one", S)
    b = prompt_keys("s" * 40 + "another question", S)
    assert a.keys[:2] == b.keys[:2] and a.keys[2] != b.keys[2]  # two whole shared blocks, then they differ
    huge = prompt_keys("x" * 10_000, S)
    assert len(huge.keys) == S.max_blocks and huge.chars == S.block_chars * S.max_blocks
    assert prompt_keys("", S).keys == []
    code = "from boute.sim.affinity import prompt_keys; from boute.specs.balancing import Affinity; "
    code += "print(prompt_keys('s' * 40 + 'question one', Affinity(block_chars=16, max_blocks=8)).keys[-1].hex())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert other.stdout.strip() == a.keys[-1].hex()  # independent gateways compute the same keys


def test_messages_render_role_and_text_in_order_within_the_limit() -> None:
    system = render_messages([("system", "be brief"), ("user", "hi")], 1000)
    assert system != render_messages([("user", "be brief"), ("user", "hi")], 1000)
    assert system.startswith(render_messages([("system", "be brief")], 1000))  # turn 1 is turn 2's prefix
    assert len(render_messages([("user", "x" * 500)] * 10, 100)) == 100


def test_the_plans_section_is_optional_validated_and_round_trips() -> None:
    assert Plan.model_validate(TEST_PLAN).affinity is None  # absent: off, existing plans unchanged
    plan = Plan.model_validate({**TEST_PLAN, "affinity": {"min_match": 0.5}})
    assert plan.affinity is not None and plan.affinity.enabled and plan.affinity.balance_rel == 1.5
    assert Plan.model_validate_json(plan.model_dump_json()) == plan
    for bad in ({"min_match": 1.5}, {"balance_rel": 0.5}, {"block_chars": 0}, {"cache": 1}):
        with pytest.raises(ValidationError):
            Plan.model_validate({**TEST_PLAN, "affinity": bad})


def test_an_imbalanced_tier_falls_back_to_least_load_on_random_loads() -> None:
    rng = random.Random(1)
    index = AffinityIndex(S)
    keys = prompt_keys(_text(rng, 100), S)
    seen = Counter()
    for _ in range(2000):
        n = rng.randint(1, 6)
        out = [rng.randint(0, 120) for _ in range(n)]
        weights = [rng.uniform(0.3, 3.0) for _ in range(n)]
        names = NAMES[:n] if n <= len(NAMES) else [f"r{i}" for i in range(n)]
        index.record(keys.keys, rng.choice(names))
        route = index.choose(keys, names, out, weights)
        loads = [o / w for o, w in zip(out, weights, strict=True)]
        imbalanced = max(loads) - min(loads) > S.balance_abs and max(loads) > S.balance_rel * min(loads)
        assert (route.reason == IMBALANCE) == imbalanced
        assert (route.choice is None) == (route.reason in (IMBALANCE, SHORT_MATCH))
        seen[route.reason] += 1
    assert seen[IMBALANCE] > 100 and seen[AFFINITY] > 100


def test_the_longest_match_wins_ties_go_to_the_least_loaded_and_short_matches_to_least_load() -> None:
    index = AffinityIndex(S)
    shared, rest = "S" * 48, "q" * 16
    index.record(prompt_keys(shared + rest, S).keys, "a")  # all four blocks
    index.record(prompt_keys(shared[:32], S).keys, "b")  # the first two
    route = index.choose(prompt_keys(shared + rest + "more", S), ["a", "b", "c"], [2, 2, 2], [1, 1, 1])
    assert (route.choice, route.reason, route.matched_chars) == (0, AFFINITY, 64)
    # a's load beyond its bound, ceil(1.5 x (8 + 1) / 3) = 5, plus one: the next-longest match within its bound
    route = index.choose(prompt_keys(shared + rest + "more", S), ["a", "b", "c"], [6, 1, 1], [1, 1, 1])
    assert (route.choice, route.reason, route.matched_chars) == (1, BOUNDED, 32)
    index.record(prompt_keys(shared + rest, S).keys, "c")
    route = index.choose(prompt_keys(shared + rest, S), ["a", "b", "c"], [3, 0, 1], [1, 1, 1])
    assert (route.choice, route.reason) == (2, AFFINITY)  # a and c tie at four blocks: c has fewer outstanding
    route = index.choose(prompt_keys(shared[:16] + "z" * 112, S), ["a", "b", "c"], [0, 0, 0], [1, 1, 1])
    assert (route.choice, route.reason, route.matched_chars) == (None, SHORT_MATCH, 16)  # 16 of 128 < 0.3


def test_rendezvous_moves_only_the_removed_replicas_prefixes_and_shares_by_weight() -> None:
    rng = random.Random(2)
    weights = [1.0, 2.0, 1.0, 0.5, 1.5]
    keys = [prompt_keys(_text(rng, 40), S).keys[0] for _ in range(4000)]
    zero = [0] * len(NAMES)
    before = [NAMES[rendezvous(k, NAMES, zero, weights, 1.5)] for k in keys]
    share = Counter(before)
    for name, w in zip(NAMES, weights, strict=True):
        assert share[name] / len(keys) == pytest.approx(w / sum(weights), abs=0.03)
    gone = 1
    names = NAMES[:gone] + NAMES[gone + 1 :]
    w2 = weights[:gone] + weights[gone + 1 :]
    after = [names[rendezvous(k, names, zero[:-1], w2, 1.5)] for k in keys]
    moved = [b for b, a in zip(before, after, strict=True) if a != b]
    assert moved and set(moved) == {NAMES[gone]}  # only the lost replica's prefixes moved
    back = [NAMES[rendezvous(k, NAMES, zero, weights, 1.5)] for k in keys]
    assert back == before  # a replica that comes back wins exactly its own share again


def test_a_new_prefix_spills_from_a_replica_beyond_its_bounded_load() -> None:
    rng = random.Random(3)
    for _ in range(500):
        key = prompt_keys(_text(rng, 20), S).keys[0]
        out = [rng.randint(0, 30) for _ in NAMES]
        weights = [rng.uniform(0.5, 2.0) for _ in NAMES]
        j = rendezvous(key, NAMES, out, weights, 1.5)
        cap = 1.5 * (sum(out) + 1) * weights[j] / sum(weights)
        assert out[j] + 1 <= cap + 1  # within ceil(c (O + 1) w / W)
    key = prompt_keys("hot", S).keys[0]
    first = rendezvous(key, NAMES, [0] * 5, [1.0] * 5, 1.5)
    out = [0] * 5
    out[first] = 10
    assert rendezvous(key, NAMES, out, [1.0] * 5, 1.5) != first  # 11 > ceil(1.5 x 11 / 5): the next choice


def test_a_forgotten_replicas_prefixes_go_to_the_others_rendezvous_choice() -> None:
    index = AffinityIndex(S)
    keys = prompt_keys("p" * 64, S)
    b = NAMES[1]
    index.record(keys.keys, b)
    assert index.choose(keys, NAMES, [0] * 5, [1.0] * 5).choice == 1
    index.forget(b)
    route = index.choose(keys, NAMES, [0] * 5, [1.0] * 5)
    others = NAMES[:1] + NAMES[2:]
    assert route.reason == NEW_PREFIX and route.choice is not None
    assert NAMES[route.choice] == others[rendezvous(keys.keys[0], others, [0] * 4, [1.0] * 4, 1.5)]
    index.record(keys.keys, b)  # it serves the prefix again after coming back: matched again
    assert index.choose(keys, [b], [0], [1.0]).reason == AFFINITY


def test_the_index_is_bounded_and_forgets_leaves_first() -> None:
    small = Affinity(block_chars=16, max_blocks=8, index_blocks=64)
    index = AffinityIndex(small)
    rng = random.Random(4)
    root = "R" * 16
    for i in range(200):
        index.record(prompt_keys(root + _text(rng, 64), small).keys, NAMES[i % 5])
        assert len(index) <= 64
    # the shared first block is touched by every prompt: never the least recently used, never evicted
    assert prompt_keys(root, small).keys[0] in index.entries
    assert all(len(e) <= 4 for e in index.entries.values())


def test_overloaded_needs_both_thresholds() -> None:
    assert not overloaded(40.0, 0.0, Affinity(balance_abs=50))  # absolute gap too small
    assert not overloaded(100.0, 80.0, Affinity(balance_abs=10))  # relative gap too small
    assert overloaded(100.0, 50.0, Affinity(balance_abs=10))
