"""Repair steps (1) and (2) of a decoded deployment (:mod:`boute.optimize.space`), on replica-count arrays.

Pure functions over per-pair arrays, in place on ``r`` (replicas per (tier, GPU type) pair): they hold the
tie rules the search's plans depend on (``tests/test_optimize_space.py`` holds them to a one-at-a-time
greedy written in plain Python), so they live apart from the encoding that calls them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def fit_inventory(
    r: np.ndarray, gpus: np.ndarray, pairs_on: Mapping[str, np.ndarray], inventory: Mapping[str, int]
) -> None:
    """Step (1): for each GPU type, while its pairs use more than ``inventory[type]`` GPUs, take one replica
    from the pair using most of them (``r[i] x gpus[i]``), ties to the lowest pair index. ``pairs_on``: each
    type's pair indices, ascending."""
    for g, inv in inventory.items():
        idx = pairs_on[g]
        used = int((r[idx] * gpus[idx]).sum())
        while used > inv:
            i = idx[int(np.argmax(r[idx] * gpus[idx]))]
            r[i] -= 1
            used -= int(gpus[i])


def fit_budget(
    r: np.ndarray, gpus: np.ndarray, price: np.ndarray, tier: np.ndarray, n_tiers: int, budget: float
) -> None:
    """Step (2): while ``sum(r x gpus x price)`` exceeds ``budget``, take one replica from the pair that spends
    most, sparing each tier's last replica while any tier has two, ties to the lowest index (``np.argmax``
    takes the first of equal values). A uniform point of a 480-GPU box takes hundreds of rounds, so a round is
    a few vector operations over the pairs (fleet-8x60: 1.47 -> 1.19 ms a decode, the same plan for each of
    21,000 random points of 14 scenarios). Spend terms are formed and summed as the space's ``_cost`` does,
    so every comparison is the same float as there."""
    per_tier = np.bincount(tier, weights=r, minlength=n_tiers)
    while True:
        spend = (r * gpus) * price
        if sum(spend.tolist()) <= budget + 1e-9:
            return
        live = r > 0
        spare = live & (per_tier[tier] > 1)
        i = int(np.argmax(np.where(spare if spare.any() else live, spend, -np.inf)))
        r[i] -= 1
        per_tier[tier[i]] -= 1
