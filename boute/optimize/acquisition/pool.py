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

from collections.abc import Iterable, Sequence
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


def axis_neighbours(space: Space, z: np.ndarray) -> np.ndarray:
    """Every plan one coordinate away from ``z``: each (TP, PP) category, each replica count, routing steps.

    This is the exhaustive part of the local search (a coordinate trust region around the incumbent):
    single changes such as 2 x TP2 -> 1 x TP4 on the same GPUs are always scored, not left to chance.
    """
    out: list[np.ndarray] = []
    for p in space.pairs:
        if p.config_dim is not None:
            for k in range(len(p.configs)):
                x = z.copy()
                x[p.config_dim] = p.config_value(k)
                out.append(x)
                y = x.copy()  # the same config at every replica count
                for n in range(0, p.inventory // p.configs[k].gpus + 1):
                    y = y.copy()
                    y[p.count_dim] = n * p.configs[k].gpus / p.inventory
                    out.append(y)
        else:
            for n in range(0, p.inventory // p.configs[0].gpus + 1):
                x = z.copy()
                x[p.count_dim] = n * p.configs[0].gpus / p.inventory
                out.append(x)
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
    """
    out: list[np.ndarray] = []
    for src in space.pairs:
        if z[src.count_dim] <= 0.0:
            continue
        for ks in range(len(src.configs)):
            base = z.copy()
            src.set_config(base, ks)
            base[src.count_dim] -= src.configs[ks].gpus / src.inventory
            for dst in space.pairs:
                if dst is src:
                    continue
                kds = [dst.config_index(z)] if z[dst.count_dim] > 0.0 else range(len(dst.configs))
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
) -> Pool:
    """Distinct canonical, unevaluated plans: ``n_local`` moves spread over ``centres`` + ``n_global`` uniform,
    and every axis, tier-off and swap neighbour of the first ``exhaustive`` centres; with ``screen``, only
    plans that pass it (counted in ``screen.pool``); none whose deployment is in ``skip_deployments``
    (:meth:`~boute.optimize.space.Candidate.deployment_key`)."""
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
    z = np.array(zs) if zs else np.zeros((0, space.dim))
    return Pool(z, tuple(cands))
