"""Quantiles of a mixture of shifted gammas: how the fast path turns per-group latency moments into P50/P95.

Each replica group (or cascade path) contributes ``shift + Gamma(shape, scale)`` with its share of the
requests as weight; the quantiles of the sum have no closed form, so they are read off the mixture's CDF on
a coarse grid refined once around each target, fast enough for thousands of evaluations per second.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import gammainc

_COARSE = np.linspace(0.0, 1.0, 96)
_FINE = np.linspace(0.0, 1.0, 24)


def _mix_cdf(w: np.ndarray, shift: np.ndarray, shape: np.ndarray, scale: np.ndarray, x: np.ndarray) -> np.ndarray:
    z = np.maximum(x[..., None] - shift, 0.0) / scale
    return (gammainc(shape, z) * w).sum(-1)


def mixture_quantiles(
    w: np.ndarray, shift: np.ndarray, shape: np.ndarray, scale: np.ndarray, qs: Sequence[float]
) -> list[float]:
    """Quantiles of sum_i w_i * (shift_i + Gamma(shape_i, scale_i)): a coarse grid, then one refinement."""
    w = w / w.sum()
    q = np.asarray(qs, dtype=float)
    lo = float(shift.min())
    hi = float(np.max(shift + shape * scale + 12.0 * np.sqrt(shape) * scale))
    x = lo + (hi - lo) * _COARSE
    cdf = _mix_cdf(w, shift, shape, scale, x)
    j = np.clip(np.searchsorted(cdf, q), 1, len(x) - 1)
    fine = x[j - 1][:, None] + (x[j] - x[j - 1])[:, None] * _FINE[None, :]
    cdf2 = _mix_cdf(w, shift, shape, scale, fine)
    out = []
    for i, qi in enumerate(q):
        xs, cs = fine[i], cdf2[i]
        out.append(float(np.interp(qi, cs, xs)))
    return out
