"""Load shares per tier and what they mean elsewhere: score cut points (pre-route), the share of queries each
tier of a cascade sees, and reweighting prompts to a traffic mix.

One definition each: the optimiser's quality model, the gateway's admission bounds and routing thresholds,
and the re-planner's observed mix all call these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from boute.quality.preroute import cut, midpoints


def check_fractions(fractions: ArrayLike, n: int) -> list[float]:
    """Validated fractions as a list of floats (plain Python: this runs on every policy evaluation)."""
    if isinstance(fractions, np.ndarray):
        f: list[float] = fractions.tolist()
    elif isinstance(fractions, list | tuple):
        f = list(fractions)
    else:  # any other array-like (a scalar then fails the length check)
        f = np.asarray(fractions, dtype=float).reshape(-1).tolist()
    if len(f) != n:
        raise ValueError(f"fractions: expected {n} values (one per tier), got {len(f)}")
    total = 0.0
    for x in f:
        if not (x >= -1e-12 and math.isfinite(x)):
            raise ValueError(f"fractions must be finite and >= 0, got {f}")
        total += x
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"fractions must sum to 1, got {total:.6g}")
    return [max(float(x), 0.0) / total for x in f]


def thresholds_for_fractions(reference_scores: ArrayLike, fractions: ArrayLike) -> np.ndarray:
    """Score cut points that send ``fractions[i]`` of the reference prompts to tier i (pre-route).

    The one definition of fractions -> thresholds: the gateway calls it, the optimiser's quality model
    applies the same :func:`~boute.quality.preroute.cut` to its cached midpoints of the same reference. Cut
    k lies halfway between the reference scores on either side of the cumulative count; 0% or 100% gives an
    infinite cut.
    """
    ref = np.sort(np.asarray(reference_scores, dtype=np.float64).reshape(-1))
    if ref.size == 0:
        raise ValueError("no reference scores to cut thresholds on")
    f = check_fractions(fractions, len(np.asarray(fractions).reshape(-1)))
    return np.array(cut(midpoints(ref), f))


def cascade_visits(shares: ArrayLike) -> np.ndarray:
    """Share of the queries that reach each tier of a cascade, from the shares that end at each tier.

    The first tier sees every query; tier k > 0 the queries that end at it or beyond (the sum of those
    shares, not ``1 -`` the others', which would carry the rounding of ``1 - 0.82`` into the gateway's
    ceil'd admission bounds). The gateway sizes each tier's admission bound by it and the quality model
    reports it; one rule for both.
    """
    s = np.asarray(shares, dtype=np.float64)
    visits = np.cumsum(s[::-1])[::-1].copy()
    visits[0] = 1.0
    return visits


def systematic_resample(weights: ArrayLike, n: int) -> np.ndarray:
    """``n`` indices drawn in proportion to ``weights`` on an even grid (no randomness: the same mix gives
    the same sample, and each index appears within one of its expected count)."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if not (w.size and np.all(w >= 0) and np.isfinite(w).all() and w.sum() > 0):
        raise ValueError("weights must be finite, >= 0 and not all 0")
    cdf = np.cumsum(w) / w.sum()
    return np.minimum(np.searchsorted(cdf, (np.arange(n) + 0.5) / n, side="right"), w.size - 1)


def mix_weights(scores: ArrayLike, edges: Sequence[float], shares: Sequence[float]) -> np.ndarray:
    """Weight per prompt so that prompts scored ``scores`` show ``shares`` per score bin (bin ``k``:
    ``edges[k-1] < score <= edges[k]``): each bin's target share over its share among these prompts.
    A bin the traffic fills but these prompts leave empty cannot be represented: the other bins carry it."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    share = np.asarray(shares, dtype=np.float64)
    if len(share) != len(edges) + 1:
        raise ValueError(f"shares: expected {len(edges) + 1} values, got {len(share)}")
    b = np.searchsorted(np.asarray(edges, dtype=np.float64), s, side="left")
    have = np.bincount(b, minlength=len(share)) / max(len(s), 1)
    per_bin = np.divide(share, have, out=np.zeros_like(share), where=have > 0)
    if not per_bin.any():
        raise ValueError("the mix puts no weight on any bin these prompts fall in")
    return per_bin[b]
