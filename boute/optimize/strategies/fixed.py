"""Fixed plans: the paper's comparison points, built directly rather than searched.

The large model alone on the best single GPU type (:func:`single_tier_single_gpu`), and both tiers with
equal resources, RouteLLM-style (:func:`equal_split`). Each fills the budget and inventory with whole
replicas (``n = min(inventory // gpus, floor(budget / (gpus x price)))``) at routing fixed to ``fractions``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from boute.optimize.space import Candidate, Space


def _max_replicas(space: Space, pair_index: int, config_index: int, budget: float) -> int:
    p = space.pairs[pair_index]
    c = p.configs[config_index]
    return int(min(p.inventory // c.gpus, math.floor(budget / (c.gpus * p.price) + 1e-9)))


def single_tier_single_gpu(space: Space, tier: int, fractions: tuple[float, ...]) -> list[Candidate]:
    """Every (GPU type, config) of ``tier`` with as many replicas as budget and inventory allow."""
    decode = _with_fractions(space, fractions)
    out = []
    for i, p in enumerate(space.pairs):
        if p.tier != tier:
            continue
        for k, _ in enumerate(p.configs):
            n = _max_replicas(space, i, k, space.budget)
            if n < 1:
                continue
            x = np.zeros(space.dim)
            x[p.count_dim] = n * p.configs[k].gpus / p.inventory
            p.set_config(x, k)
            out.append(decode(x))
    return out


def equal_split(space: Space, fractions: tuple[float, ...]) -> list[Candidate]:
    """RouteLLM-style: each tier gets an equal share of the budget on one GPU type of its own choosing."""
    tiers = [t for t in space.active_tiers if fractions[t] > 0]
    share = space.budget / len(tiers)
    per_tier: list[list[tuple[int, int, int]]] = []
    for t in tiers:
        opts = []
        for i, p in enumerate(space.pairs):
            if p.tier != t:
                continue
            for k in range(len(p.configs)):
                n = _max_replicas(space, i, k, share)
                if n >= 1:
                    opts.append((i, k, n))
        per_tier.append(opts)
    decode = _with_fractions(space, fractions)
    out: list[Candidate] = []
    for combo in np.array(np.meshgrid(*[np.arange(len(o)) for o in per_tier])).T.reshape(-1, len(per_tier)):
        x = np.zeros(space.dim)
        used: dict[str, int] = {}
        ok = True
        for t_i, j in enumerate(combo):
            i, k, n = per_tier[t_i][int(j)]
            p = space.pairs[i]
            used[p.gpu] = used.get(p.gpu, 0) + n * p.configs[k].gpus
            ok &= used[p.gpu] <= p.inventory
            x[p.count_dim] = n * p.configs[k].gpus / p.inventory
            p.set_config(x, k)
        if ok:
            out.append(decode(x))
    return out


def _with_fractions(space: Space, fractions: tuple[float, ...]) -> Callable[[np.ndarray], Candidate]:
    """A decoder of ``space``'s points with routing fixed to ``fractions``: the deployment part of ``x``
    decoded in the fixed-routing space, built once per family (building a space evaluates the performance
    model of every fitting config, far more than a decode)."""
    fixed = Space.build(space.scenario, gpus=space.gpus, tiers=space.active_tiers, fixed_fractions=fractions)
    skip = space.n_routing if fixed.n_routing == 0 else 0

    def decode(x: np.ndarray) -> Candidate:
        return fixed.decode(x[skip:])

    return decode
