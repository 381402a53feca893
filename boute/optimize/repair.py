"""Repair steps (1) and (2) of a decoded deployment (:mod:`boute.optimize.space`), on replica-count arrays.

Pure functions over per-pair arrays, in place on ``r`` (replicas per (tier, GPU type) pair): they hold the
tie rules the search's plans depend on (``tests/test_optimize_space.py`` holds them to a one-at-a-time
greedy written in plain Python), so they live apart from the encoding that calls them.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

import numpy as np


def fit_inventory(
    r: np.ndarray, gpus: np.ndarray, pairs_on: Mapping[str, np.ndarray], inventory: Mapping[str, int]
) -> None:
    """Step (1): for each GPU type, while its pairs use more than ``inventory[type]`` GPUs, take one replica
    from the pair using most of them (``r[i] x gpus[i]``), ties to the lowest pair index. ``pairs_on``: each
    type's pair indices, ascending. A type has a pair per tier (two or three), so a round is a ``max`` over a
    short Python list: a numpy round costs more in call overhead than it saves."""
    for g, inv in inventory.items():
        idx = pairs_on[g].tolist()
        per = [int(gpus[i]) for i in idx]  # GPUs per replica
        used = [int(r[i]) * n for i, n in zip(idx, per, strict=True)]
        total = sum(used)
        while total > inv:
            j = max(range(len(idx)), key=lambda j: (used[j], -j))
            r[idx[j]] -= 1
            used[j] -= per[j]
            total -= per[j]


def fit_budget(
    r: np.ndarray, gpus: np.ndarray, price: np.ndarray, tier: np.ndarray, n_tiers: int, budget: float
) -> None:
    """Step (2): while ``sum(r x gpus x price)`` exceeds ``budget``, take one replica from the pair that spends
    most, sparing each tier's last replica while any tier has two, ties to the lowest index.

    A uniform point of a 480-GPU box takes hundreds of rounds, so the pairs' spends sit in a heap keyed
    ``(-spend, index)`` (the largest spend first, ties to the lowest index), with stale entries skipped as
    they surface: a round's choice is O(log pairs) instead of numpy passes over the pairs (its stop test
    still sums the spends afresh, one builtin ``sum``, below). While some tier has two
    replicas, an entry of a tier down to its last is set aside (a tier's count only falls, so it stays out
    until no tier has two); after that the rounds are a plain ``max`` over the live pairs. Spend terms are
    formed and summed in pair order as the space's ``_cost`` does, so every comparison is the same float as
    there, and the plans are the one-at-a-time greedy's of ``tests/test_optimize_space.py``. On fleet-8x60
    (6,815 uniform, local-move, swap and axis points, CPU time) a whole decode took 0.61 ms with a round of
    numpy vector operations, 0.26 ms with the heap, the same plans."""
    rl: list[int] = r.tolist()
    gl: list[int] = gpus.tolist()
    pl: list[float] = price.tolist()
    tl: list[int] = tier.tolist()
    spend = [(ri * gi) * pi for ri, gi, pi in zip(rl, gl, pl, strict=True)]
    limit = budget + 1e-9
    if sum(spend) <= limit:
        return
    per_tier = [0] * n_tiers
    for t, ri in zip(tl, rl, strict=True):
        per_tier[t] += ri
    multi = sum(c > 1 for c in per_tier)  # tiers with two replicas or more: their pairs are the spare ones
    heap = [(-s, i) for i, s in enumerate(spend) if rl[i] > 0]
    heapq.heapify(heap)
    while sum(spend) > limit:
        if multi:
            while True:
                neg, i = heapq.heappop(heap)
                if rl[i] > 0 and -neg == spend[i] and per_tier[tl[i]] > 1:
                    break
        else:
            i = max((j for j in range(len(rl)) if rl[j] > 0), key=lambda j: (spend[j], -j))
        rl[i] -= 1
        r[i] -= 1
        spend[i] = (rl[i] * gl[i]) * pl[i]
        per_tier[tl[i]] -= 1
        multi -= per_tier[tl[i]] == 1
        if rl[i] > 0:
            heapq.heappush(heap, (-spend[i], i))
