"""Candidate pools for the acquisition: canonical plans near the incumbents plus a global sample.

Why a pool instead of gradient ascent on the continuous relaxation: the box has large flat regions (GPU
counts are rounded, configs are categories, repair folds many points onto one plan), so a gradient
optimiser spends its effort on points that decode to plans already evaluated, and the GP sees rounded
points it was never told about. Here every pool point is *canonical* (``encode(decode(x))``), distinct
and not yet evaluated, so the acquisition is compared only over real, new plans, exactly as the GP is
trained, and the exact quality of each one is known before any evaluation. Mixed variables are handled
natively: moves step GPU counts by whole replicas and switch (TP, PP) categories. With a screen
(:mod:`boute.optimize.screen`) every raw point's routing is first moved into the floor region and plans
that cannot carry their load are dropped, so the acquisition only ranks plans that might succeed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from boute.optimize.screen import Screen
from boute.optimize.space import Candidate, Space


@dataclass(frozen=True)
class Pool:
    z: np.ndarray  # (m, d) canonical points
    candidates: tuple[Candidate, ...]


def _move(space: Space, z: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One random local move: 1-3 coordinates changed by a whole step, routing nudged half the time."""
    x = z.copy()
    d = space.dim
    for j in rng.choice(d, size=min(d, int(rng.integers(1, 4))), replace=False):
        if j < space.n_routing:
            x[j] = x[j] + rng.normal(0.0, float(rng.choice((0.01, 0.04, 0.15))))
            continue
        pair = next(p for p in space.pairs if j in (p.count_dim, p.config_dim))
        if j == pair.config_dim:
            x[j] = pair.config_value(int(rng.integers(len(pair.configs))))
        elif rng.random() < 0.3:
            x[j] = rng.random()
        else:
            step = pair.configs[pair.config_index(x)].gpus * int(rng.choice((-2, -1, 1, 1, 2)))
            x[j] = x[j] + step / pair.inventory
    if space.n_routing and rng.random() < 0.5:
        r = space.n_routing
        x[:r] = x[:r] + rng.normal(0.0, 0.02, size=r)
    return np.clip(x, 0.0, 1.0)


#: a (TP, PP) config with at most this many replica counts on its GPU type has every one of them among the
#: axis neighbours; above (the 480-GPU fleet's 60-GPU types at TP1, TP2), a ladder around the current count
LADDER_ABOVE = 24
#: above this many swap neighbours (the fleet's ~2,800, against at most 728 on the scenarios of the strategy
#: table and the paper's scaling ones), only deployed groups exchange replicas
SWAP_FULL = 1000


def replica_counts(n_max: int, around: int) -> list[int]:
    """The replica counts an axis move tries on a config allowing ``0 .. n_max``: all of them up to
    :data:`LADDER_ABOVE`, else ``0``, ``n_max`` and ``around +- 1, 2, 4, 8, ...``.

    Why a ladder at scale: a step to a far count is rarely the best single change (on the fleet's stored
    search, 3 of 52 proposals came from the 10,702 axis plans scored, and none from a far count), while
    every count of a 60-GPU type is 61 plans to screen and score per config; the random local moves and
    the global sample still reach any count."""
    if n_max <= LADDER_ABOVE:
        return list(range(n_max + 1))
    out = {0, n_max}
    step = 1
    while step <= n_max:
        out.update(c for c in (around - step, around + step) if 0 <= c <= n_max)
        step *= 2
    return sorted(out)


def axis_neighbours(space: Space, z: np.ndarray) -> np.ndarray:
    """Every plan one coordinate away from ``z``: each (TP, PP) category, each replica count (a ladder of
    them where a GPU type holds many, :func:`replica_counts`), routing steps.

    This is the exhaustive part of the local search (a coordinate trust region around the incumbent):
    single changes such as 2 x TP2 -> 1 x TP4 on the same GPUs are always scored, not left to chance.
    """
    out: list[np.ndarray] = []
    for p in space.pairs:
        gpus = int(round(z[p.count_dim] * p.inventory))  # the pair's GPUs now: the ladder's centre
        for k in range(len(p.configs)):
            x = z.copy()
            if p.config_dim is not None:
                x[p.config_dim] = p.config_value(k)
                out.append(x)
            g = p.configs[k].gpus
            for n in replica_counts(p.inventory // g, gpus // g):  # the same config at other replica counts
                y = x.copy()
                y[p.count_dim] = n * g / p.inventory
                out.append(y)
    for j in range(space.n_routing):
        for dv in (-0.08, -0.04, -0.02, -0.01, -0.005, 0.005, 0.01, 0.02, 0.04, 0.08):
            x = z.copy()
            x[j] = np.clip(x[j] + dv, 0.0, 1.0)
            out.append(x)
    return np.array(out) if out else np.zeros((0, space.dim))


def tier_off_neighbours(space: Space, z: np.ndarray) -> np.ndarray:
    """Every plan that switches one loaded tier of ``z`` off: its share moves to the nearest loaded tier
    below or above, and its replicas go to zero.

    Why a move of its own: dropping a tier takes two coordinated changes (its share to 0 *and* every count
    dim of the tier to 0). :func:`axis_neighbours` changes one coordinate and the space's repair re-adds a
    replica to any tier that still has load, so a plan without the middle tier (three-tier-mix at its
    cheapest: small 0.82 + large 0.18, $5.72/h against $6.40/h with the middle tier) was found only by chance.
    """
    if space.n_routing == 0:
        return np.zeros((0, space.dim))
    fr = space.decode(z).fractions
    loaded = [t for t in space.active_tiers if fr[t] > 0.0]  # ascending, as active_tiers is
    out: list[np.ndarray] = []
    for i, t in enumerate(loaded):
        for dest in loaded[max(0, i - 1) : i] + loaded[i + 1 : i + 2]:  # the loaded tier below, then above
            f = np.asarray(fr, dtype=float)
            f[dest] += f[t]
            f[t] = 0.0
            x = z.copy()
            x[: space.n_routing] = space.routing_point(f)
            for p in space.pairs:
                if p.tier == t:
                    x[p.count_dim] = 0.0
            out.append(x)
    return np.array(out) if out else np.zeros((0, space.dim))


def swap_neighbours(space: Space, z: np.ndarray) -> np.ndarray:
    """Every plan that exchanges one replica between two (tier, GPU) groups of ``z``, routing unchanged: a
    deployed group ``src`` is re-sharded to any of its (TP, PP) configs on the same GPUs and gives up one
    replica of that config; any other group ``dst`` gains one replica, at its own config if it is deployed,
    at each of its configs if not.

    Why a move of its own: when the budget binds, the optimum and a near miss often differ by one exchange
    (one 70B replica moved from H100 to RTX PRO 6000 GPUs, or a small-tier replica traded for a large-tier
    one). :func:`axis_neighbours` changes one coordinate, so the extra replica is trimmed by the budget repair
    and the fewer one alone only loses capacity: neither half improves, and the pair was left to chance. The
    re-sharding covers the exchange the long-prompt scenario's cheapest plan needs: 1 x TP4 on four H100s
    becomes 2 x TP2, one of which moves to RTX PRO 6000s. In count coordinates ``x[src] -= g_src / I_src`` and
    ``x[dst] += g_dst / I_dst``, with ``g`` a replica's GPUs at the chosen config and ``I`` the GPU type's
    inventory.

    At scale (more than :data:`SWAP_FULL` of them) only deployed groups exchange replicas; a group not
    deployed joins by an axis move (one replica from zero), a local move or the global sample. On the
    480-GPU fleet's stored search (13 steps, 27,500 plans scored), exchanges into a new group (at the config
    nearest in GPUs per replica, as they then were) were 6,044 of the pool's plans and 2 of the 52 top picks,
    those between deployed groups 8,027 and 23; without the former, three seeds' searches ended at P95
    3.303 / 3.581 / 3.943 s against 3.380 / 3.581 / 3.815 s, in 3-21% less time (interleaved, one run each).
    """
    deployed = [p for p in space.pairs if z[p.count_dim] > 0.0]
    full = sum(len(s.configs) for s in deployed) * sum(
        1 if z[d.count_dim] > 0.0 else len(d.configs) for d in space.pairs
    )
    out: list[np.ndarray] = []
    for src in deployed:
        for ks in range(len(src.configs)):
            base = z.copy()
            src.set_config(base, ks)
            g = src.configs[ks].gpus
            base[src.count_dim] -= g / src.inventory
            for dst in space.pairs:
                if dst is src:
                    continue
                if z[dst.count_dim] > 0.0:
                    kds: Sequence[int] = [dst.config_index(z)]
                elif full <= SWAP_FULL:
                    kds = range(len(dst.configs))
                else:  # at scale: only exchanges between deployed groups (docstring)
                    continue
                for kd in kds:
                    x = base.copy()
                    dst.set_config(x, kd)
                    x[dst.count_dim] += dst.configs[kd].gpus / dst.inventory
                    out.append(np.clip(x, 0.0, 1.0))
    return np.array(out) if out else np.zeros((0, space.dim))


def build_pool(
    space: Space,
    centres: Sequence[np.ndarray],
    seen: Iterable[str],
    rng: np.random.Generator,
    *,
    n_global: int = 256,
    n_local: int = 384,
    screen: Screen | None = None,
    exhaustive: int = 1,
    skip_deployments: frozenset[str] | set[str] = frozenset(),
    feed: Callable[[str, Candidate], None] | None = None,
) -> Pool:
    """Distinct canonical, unevaluated plans: ``n_local`` moves spread over ``centres`` + ``n_global`` uniform,
    and every axis, tier-off and swap neighbour of the first ``exhaustive`` centres; with ``screen``, only
    plans that pass it (counted in ``screen.pool``); none whose deployment is in ``skip_deployments``
    (:meth:`~boute.optimize.space.Candidate.deployment_key`). ``feed`` is given each plan (its key and itself)
    as it joins, so work on the pool (the prior's figures:
    :meth:`~boute.optimize.surrogates.prior.PriorLatency.prefetch`) can start before it is complete."""
    raw: list[np.ndarray] = [rng.random((n_global, space.dim))] if n_global else []
    if centres:
        for c in centres[:exhaustive]:
            c = np.asarray(c, dtype=float)
            raw.extend((axis_neighbours(space, c), tier_off_neighbours(space, c), swap_neighbours(space, c)))
        per = max(1, n_local // len(centres))
        for c in centres:
            raw.append(np.array([_move(space, np.asarray(c, dtype=float), rng) for _ in range(per)]))
    known = set(seen)
    zs: list[np.ndarray] = []
    cands: list[Candidate] = []
    removed: set[str] = set()
    for x in np.concatenate(raw) if raw else np.zeros((0, space.dim)):
        if screen is None:
            cand = space.decode(x)
        else:
            _, cand, why = screen.admit(x, pool=True)
            if why is not None:
                removed.add(cand.key())
                continue
        key = cand.key()
        if key in known or key in removed or (skip_deployments and cand.deployment_key() in skip_deployments):
            continue
        known.add(key)
        zs.append(space.encode(cand))
        cands.append(cand)
        if feed is not None:
            feed(key, cand)
    z = np.array(zs) if zs else np.zeros((0, space.dim))
    return Pool(z, tuple(cands))
