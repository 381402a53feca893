"""The prefix-cache model (boute/perf/prefix_cache.py) against a plain radix tree with timestamps, on random
workloads of shared prefixes: same hits, same held tokens, same survivors after every operation."""

from __future__ import annotations

import numpy as np
import pytest

from boute.perf.prefix_cache import BLOCK_TOKENS, PrefixCache, chained_keys, token_path


class ReferenceTree:
    """Written for clarity, not speed: nodes with a last-use time; evict the leaf with the oldest time."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.nodes: dict[object, dict] = {}  # key -> {"parent", "tokens", "t"}
        self.clock = 0

    def _use(self, path, depth: int) -> None:
        self.clock += 1
        for key, _ in path[:depth]:
            self.nodes[key]["t"] = self.clock

    def match(self, path, prompt_tokens: int) -> int:
        depth = 0
        while depth < len(path) and path[depth][0] in self.nodes:
            depth += 1
        self._use(path, depth)
        return max(0, min(sum(t for _, t in path[:depth]), prompt_tokens - 1))

    def insert(self, path) -> None:
        parent = None
        for key, tokens in path:
            self.nodes.setdefault(key, {"parent": parent, "tokens": tokens, "t": 0})
            parent = key
        self._use(path, len(path))
        self.evict()

    def evict(self) -> None:
        while sum(n["tokens"] for n in self.nodes.values()) > self.capacity:
            parents = {n["parent"] for n in self.nodes.values()}
            leaves = [k for k in self.nodes if k not in parents]
            # ties (one path touched at one instant): the deepest first, as the model touches deepest-first
            oldest = min(leaves, key=lambda k: (self.nodes[k]["t"], -self._depth(k)))
            del self.nodes[oldest]

    def _depth(self, key) -> int:
        d = 0
        while key is not None:
            key, d = self.nodes[key]["parent"], d + 1
        return d


def _random_paths(rng: np.random.Generator, n: int) -> list[list[tuple[object, int]]]:
    """Prompts over a skewed set of system prompts, some continuing an earlier conversation."""
    systems = [(("sys", s), int(rng.integers(50, 3000))) for s in range(8)]
    popularity = 1.0 / np.arange(1, 9) ** 1.1
    paths: list[list[tuple[object, int]]] = []
    for i in range(n):
        if paths and rng.random() < 0.3:  # a later turn: an earlier prompt, then this turn's text
            base = list(paths[int(rng.integers(len(paths)))])
        else:
            base = [systems[int(rng.choice(8, p=popularity / popularity.sum()))]]
        paths.append(base + [(("turn", i), int(rng.integers(1, 400)))])
    return paths


@pytest.mark.parametrize("seed", [10, 11, 12, 13])
def test_the_cache_matches_a_plain_radix_tree_with_lru_leaf_eviction(seed: int) -> None:
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(1_000, 15_000))
    model, ref = PrefixCache(capacity), ReferenceTree(capacity)
    hits = []
    for path in _random_paths(rng, 500):
        total = sum(t for _, t in path)
        before = model.peek(path, total)
        got, want = model.match(path, total), ref.match(path, total)
        assert got == want == before
        hits.append(got)
        model.insert(path)
        ref.insert(path)
        assert model.held == sum(n["tokens"] for n in ref.nodes.values()) <= capacity
        assert set(model.nodes) == set(ref.nodes)
    assert sum(hits) > 0  # the workload does share prefixes
    assert model.hit_tokens == sum(hits)


def test_a_repeated_prompt_hits_all_but_its_last_token_and_eviction_is_by_recency() -> None:
    cache = PrefixCache(1_000)
    a = [("sys", 600), ("a", 100)]
    b = [("sys", 600), ("b", 100)]
    assert cache.match(a) == 0
    cache.insert(a)
    assert cache.match(a) == 699  # the last token is computed for the first answer token's logits
    assert cache.match(b) == 600
    cache.insert(b)  # 800 tokens held
    cache.match(a)  # a is now newer than b
    cache.insert([("c", 300)])  # over budget by 100: b, the least recently used leaf, goes
    assert set(cache.nodes) == {"sys", "a", "c"} and cache.held == 1_000
    cache.limit(300)  # shrinking evicts leaves oldest first, and a parent only after its children
    assert set(cache.nodes) == {"c"}
    assert cache.evicted_tokens == 100 + 700


def test_a_path_longer_than_the_budget_keeps_its_longest_prefix_that_fits() -> None:
    cache = PrefixCache(250)
    cache.insert([("x", 100), ("y", 100), ("z", 100)])
    assert list(cache.nodes) == ["y", "x"] and cache.held == 200


def test_token_paths_share_exactly_their_common_leading_blocks() -> None:
    sys_prompt = [f"w{i} " for i in range(5 * BLOCK_TOKENS + 3)]
    one = token_path(sys_prompt + ["hello", " there"])
    two = token_path(sys_prompt + ["good", "bye"])
    shared = [k for (k, _), (k2, _) in zip(one, two, strict=False) if k == k2]
    assert len(shared) == 5  # the partial sixth block differs
    assert sum(t for _, t in one) == len(sys_prompt) + 2
    assert chained_keys(["a", "b"]) == chained_keys(["a", "b"]) != chained_keys(["b", "a"])
    assert chained_keys(["ab", "c"]) != chained_keys(["a", "bc"])
    with pytest.raises(ValueError, match="block_tokens"):
        token_path(["a"], 0)
