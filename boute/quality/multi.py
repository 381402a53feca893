"""A multi-model router: per-prompt predicted correctness of every tier, routed by per-tier prices.

With N models whose quality is not ordered by cost (RouterBench: Llama-2-70B below Mixtral-8x7B on ARC), a
single difficulty score cut into N intervals sends a query to the next tier up whether or not that model
is the one likely to answer it. This router predicts, for each prompt x and tier k, the probability
``p_k(x)`` that tier k answers it well (one logistic regression per tier on the same features as the
ladder router: static prompt embedding + the 7 shape features, C by 5-fold CV, trained on the profile's
training rows), and sends x to

    tier(x) = argmax_k  p_k(x) - lambda_k,      lambda_0 = 0,

where the prices ``lambda`` are set so that the calibration prompts (the whole profile, as for the ladder's
thresholds) split over the tiers in the requested load shares. So the optimiser's knobs are unchanged:
N load fractions per tier, mapped to N-1 prices as the ladder maps them to N-1 thresholds. With shares
fixed, this assignment maximises the summed predicted correctness (the prices are the dual variables of
the per-tier capacity constraints of that assignment problem).

Prices for given shares (:func:`prices_for_shares`): coordinate ascent on the dual. For tier k, its margin
on prompt i is ``p_ik - max_{j != k} (p_ij - lambda_j)``; tier k wins exactly the prompts whose margin
exceeds lambda_k, so setting lambda_k halfway between the n_k-th and (n_k+1)-th largest margins gives it
n_k prompts. Sweeping the tiers until every count is within one of its target converges in a few sweeps
on the profiles here (N <= 5, about a thousand prompts: well under a millisecond per sweep). A tier with
share 0 gets price +inf (never chosen).

Scoring one live prompt costs the ladder's embedding plus N dot products: proxy speed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from boute.errors import SpecError
from boute.quality.head import LinearHead, fit_head, shape_features
from boute.quality.profiles import QualityProfile
from boute.quality.static_embed import StaticEmbedder

MAX_SWEEPS = 200


@dataclass(frozen=True)
class MultiRouter:
    """One logistic head per tier on static embeddings + standardised shape features."""

    tiers: tuple[str, ...]
    heads: tuple[LinearHead, ...]
    feat_mean: np.ndarray
    feat_std: np.ndarray
    static: StaticEmbedder
    good_threshold: float = 0.5

    def features(self, prompts: Sequence[str], emb: np.ndarray | None = None) -> np.ndarray:
        e = self.static.embed(prompts) if emb is None else emb
        shape = (shape_features(prompts) - self.feat_mean) / self.feat_std
        return np.hstack([np.asarray(e, np.float64), shape])

    def predict(self, prompts: Sequence[str], emb: np.ndarray | None = None) -> np.ndarray:
        """(n, N): predicted probability that each tier's answer is good (score >= good_threshold)."""
        x = self.features(prompts, emb)
        return np.stack([h.proba(x)[:, 1] for h in self.heads], axis=1)


def train_multi_router(
    profile: QualityProfile,
    tier_models: Sequence[str],
    train: np.ndarray,
    static: StaticEmbedder,
    *,
    seed: int = 0,
    good_threshold: float = 0.5,
) -> MultiRouter:
    """Fit one head per tier on the ``train`` rows (label: that tier's score >= ``good_threshold``)."""
    emb = static.embed(profile.prompts)
    shape = shape_features(profile.prompts)
    mean, std = shape[train].mean(axis=0), shape[train].std(axis=0)
    std = np.where(std > 0, std, 1.0)
    x = np.hstack([np.asarray(emb, np.float64), (shape - mean) / std])
    heads = []
    for m in tier_models:
        y = (profile.column(m)[train] >= good_threshold).astype(np.int64)
        if y.min() == y.max():
            raise SpecError(
                profile.source, f"models.{m}", "every training query has the same outcome: nothing to learn"
            )
        head, _ = fit_head(x[train], y, seed)
        heads.append(head)
    return MultiRouter(tuple(tier_models), tuple(heads), mean, std, static, good_threshold)


def route(p: np.ndarray, prices: ArrayLike) -> np.ndarray:
    """Tier per prompt: argmax_k p_k - lambda_k (ties to the lower tier)."""
    return np.argmax(np.asarray(p, np.float64) - np.asarray(prices, np.float64)[None, :], axis=1)


def _targets(fractions: ArrayLike, m: int) -> np.ndarray:
    """Integer prompt counts per tier summing to m (largest remainders)."""
    f = np.asarray(fractions, np.float64).reshape(-1)
    if (f < -1e-12).any() or not math.isclose(float(f.sum()), 1.0, abs_tol=1e-6):
        raise ValueError(f"fractions must be >= 0 and sum to 1, got {f.tolist()}")
    raw = np.maximum(f, 0.0) / f.sum() * m
    n = np.floor(raw).astype(np.int64)
    n[np.argsort(-(raw - n), kind="stable")[: m - int(n.sum())]] += 1
    return n


def prices_for_shares(p_cal: np.ndarray, fractions: ArrayLike) -> np.ndarray:
    """Prices lambda (len N, lambda of the first used tier 0) giving ``fractions`` of ``p_cal``'s prompts to
    each tier under :func:`route` (module doc: coordinate ascent on the assignment dual)."""
    p = np.asarray(p_cal, np.float64)
    m, n_tiers = p.shape
    want = _targets(fractions, m)
    lam = np.zeros(n_tiers)
    lam[want == 0] = np.inf
    used = np.flatnonzero(want > 0)
    if used.size == 1:
        return lam
    free = used[1:]  # the first used tier's price anchors the others (only differences matter)
    for _ in range(MAX_SWEEPS):
        for k in free:
            others = p - lam[None, :]
            others[:, k] = -np.inf
            margin = p[:, k] - others.max(axis=1)
            srt = np.sort(margin)[::-1]
            nk = int(want[k])
            lam[k] = (srt[nk - 1] + srt[nk]) / 2.0 if nk < m else srt[-1] - 1.0
        got = np.bincount(route(p, lam), minlength=n_tiers)
        if np.abs(got - want).max() <= 1:
            break
    return lam
