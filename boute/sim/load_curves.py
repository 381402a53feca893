"""Per-replica load curves and least-outstanding balancing over them, cached for the fast path.

The optimiser calls :func:`boute.sim.fastpath.fast_evaluate` thousands of times with the same scenario and
few replica types, so what depends only on a replica type (its timing table, capacity and the curve of
outstanding requests, latency terms and prefill wait against its rate) is computed once and interpolated
afterwards; :func:`balance` splits a tier's rate over its groups on those curves.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from boute.sim.capacity import Lengths, OperatingPoint, capacity_rps, kv_batch, operating_point, prefill_queue
from boute.sim.timing import ReplicaTiming
from boute.sim.timing_cache import on_evict

# ---- caches keyed by a timing table's id (emptied with the tables: boute.sim.timing_cache.on_evict) ----
_CAPS: dict[tuple, tuple[float, int]] = {}


def _forget() -> None:
    """Empty the caches keyed by a timing's id: a freed timing's id may be reused."""
    _CAPS.clear()
    _LOAD.clear()
    _TIER.clear()
    _BALANCED.clear()


on_evict(_forget)


def capacity_and_slots(tm: ReplicaTiming, ln: Lengths) -> tuple[float, int]:
    key = (id(tm), ln)
    hit = _CAPS.get(key)
    if hit is None:
        if len(_CAPS) > 65536:
            _CAPS.clear()
        hit = _CAPS[key] = (capacity_rps(tm, ln), kv_batch(tm, ln))
    return hit


_RHO_GRID = (0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.87, 0.93, 0.97, 0.985, 0.995)
_LOAD: dict[tuple, tuple[list[float], ...]] = {}


def _residence(op: OperatingPoint, mean_out: float) -> float:
    return 0.5 * op.step_s + op.prefill_s + op.step_s / max(1e-9, 1.0 - op.prefill_share) * (mean_out - 1)


def _load_curve(tm: ReplicaTiming, mu: float, ln: Lengths) -> tuple[list[float], ...]:
    """One replica over a grid of rates up to its capacity (cached per replica type and lengths):
    outstanding requests (rate x residence, Little), rate, time to first token A (with the wait for the
    prefill stage), per-token time tau, the prefill wait's variance, the decode-stall variance per token
    and the prefill stage's utilisation. Evaluations interpolate in it instead of re-solving."""
    key = (id(tm), ln)
    hit = _LOAD.get(key)
    if hit is None:
        lams = [r * mu for r in _RHO_GRID]
        ops = [operating_point(tm, x, ln) for x in lams]
        pqs = [prefill_queue(tm, x, ln, op) for x, op in zip(lams, ops, strict=True)]
        outs = [
            x * (_residence(op, ln.mean_out) + q.wait_mean + q.decode_start_wait)
            for x, op, q in zip(lams, ops, pqs, strict=True)
        ]
        for i in range(1, len(outs)):  # guard monotonicity against approximation wiggles
            outs[i] = max(outs[i], outs[i - 1] + 1e-9)
        a = [0.5 * op.step_s + op.prefill_s + q.wait_mean + q.decode_start_wait for op, q in zip(ops, pqs, strict=True)]
        tau = [op.step_s / max(1e-9, 1.0 - op.prefill_share) for op in ops]
        if len(_LOAD) > 65536:
            _LOAD.clear()
        hit = _LOAD[key] = (
            outs,
            lams,
            a,
            tau,
            [q.wait_var for q in pqs],
            [q.stall_var_per_token for q in pqs],
            [q.work_rho for q in pqs],
            [q.wait_mean for q in pqs],
            [q.decode_start_wait for q in pqs],
        )
    return hit


_TIER: dict[tuple, tuple[np.ndarray, np.ndarray, list]] = {}
_TIER_GRID = 1024


def _tier_curve(counts: list[float], mus: list[float], curves: list) -> tuple[np.ndarray, np.ndarray]:
    """The tier's total rate at each balancing level c on a fine grid, cached per replica mix.

    It depends only on the groups (not on the offered rate), and the optimiser revisits the same mixes
    at many rates, so each call of :func:`balance` is then one interpolation instead of a grid search.
    The rate is piecewise linear and non-decreasing in c, so linear interpolation on the grid is close;
    the caller rescales the group rates to add up exactly.
    """
    key = tuple(zip(counts, mus, map(id, curves), strict=True))
    hit = _TIER.get(key)
    if hit is None:
        hi = float(max((cv[0][-1] + 1.0) / mu for mu, cv in zip(mus, curves, strict=True)))
        cs = np.linspace(0.0, hi, _TIER_GRID)
        tot = sum(n * np.interp(cs * mu - 1.0, cv[0], cv[1]) for n, mu, cv in zip(counts, mus, curves, strict=True))
        tot = np.maximum.accumulate(np.asarray(tot, dtype=float))
        if len(_TIER) > 16384:
            _TIER.clear()
        hit = _TIER[key] = (cs, tot, curves)  # keeps the curves alive, so their ids stay unique
    return hit[0], hit[1]


def _interp(x: float, xs: list[float], rows: Sequence[list[float]]) -> tuple[float, ...]:
    """``np.interp(x, xs, row)`` for each row, as numpy computes it (end values outside the grid; at a grid
    point its value; else ``slope * (x - x_j) + y_j``), with one search for all rows. The fast path asks this
    of every group of every pool plan, and ``np.interp`` on these short lists is mostly conversion and call
    overhead: the seven rows of :func:`_at` took 3.9 s of a profiled replay of the 480-GPU fleet's search
    (60 s), one search 1.1 s. The same floats (``tests/test_fastpath.py`` compares them on random grids)."""
    j = bisect_right(xs, x) - 1
    if j < 0:
        return tuple(y[0] for y in rows)
    if j >= len(xs) - 1 or xs[j] == x:
        return tuple(y[j] for y in rows)
    x0, dx = xs[j], xs[j + 1] - xs[j]
    return tuple((y[j + 1] - y[j]) / dx * (x - x0) + y[j] for y in rows)


def _at(cv: tuple[list[float], ...], lam: float) -> tuple[float, ...]:
    """(A, tau, wait variance, stall variance per token, prefill utilisation, mean prefill wait, decode-start
    wait) at ``lam``."""
    return _interp(lam, cv[1], cv[2:9])


_BALANCED: dict[tuple, tuple[list[tuple[float, ...]], list[float]]] = {}


def balance(
    groups: list[tuple[ReplicaTiming, int, float, int]], lam: float, ln: Lengths
) -> tuple[list[tuple[float, ...]], list[float]]:
    """:func:`_balance`, remembered per (tier's groups, rate, lengths): the optimiser's candidate pools score
    plans that differ from their centre in one or two tiers, so most of a plan's tiers were balanced before
    (on the 480-GPU fleet's pools, 27% of the tier terms asked for are distinct). Exact: the same inputs."""
    key = (tuple((id(tm), n, mu) for tm, n, mu, _ in groups), lam, ln)
    hit = _BALANCED.get(key)
    if hit is None:
        if len(_BALANCED) > 65536:
            _BALANCED.clear()
        hit = _BALANCED[key] = _balance(groups, lam, ln)
    return [*hit[0]], [*hit[1]]


def _balance(
    groups: list[tuple[ReplicaTiming, int, float, int]], lam: float, ln: Lengths
) -> tuple[list[tuple[float, ...]], list[float]]:
    """(A, tau, variances, prefill utilisation) and request share of each group under least-outstanding, capacity-weighted balancing.

    The balancer equalises (outstanding + 1) / capacity across replicas, and outstanding = rate x
    residence (Little), so at a common level ``c`` each replica holds ``c * mu_g - 1`` requests; its rate
    follows from its (cached, monotone) outstanding-vs-rate curve, and ``c`` is read off the tier's cached
    rate-vs-level curve so the rates add up to the tier's. Slow replicas hold requests longer and so get less than their
    capacity share at light load.
    """
    total_cap = sum(n * mu for _, n, mu, _ in groups)
    curves = [_load_curve(tm, mu, ln) for tm, _, mu, _ in groups]
    if len(groups) == 1:
        _, n, _, _ = groups[0]
        cv = curves[0]
        return [_at(cv, lam / n)], [1.0]
    mus = [float(mu) for _, _, mu, _ in groups]
    counts = [float(n) for _, n, _, _ in groups]
    cs, tot = _tier_curve(counts, mus, curves)
    c = float(np.interp(lam, tot, cs))
    lams = [_interp(c * mu - 1.0, cv[0], cv[1:2])[0] for mu, cv in zip(mus, curves, strict=True)]
    got = sum(n * x for n, x in zip(counts, lams, strict=True))
    if float(tot[-1]) < lam or got <= 0:
        # beyond the curves, or a load so light that the level falls inside the grid's first cell (no replica
        # holds a request yet): capacity-proportional
        lams = [lam * mu / total_cap for _, _, mu, _ in groups]
    else:
        lams = [x * lam / got for x in lams]
    at = [_at(cv, x) for x, cv in zip(lams, curves, strict=True)]
    return at, [n * x / lam for (_, n, _, _), x in zip(groups, lams, strict=True)]
