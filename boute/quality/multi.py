"""A multi-model router: per-prompt predicted correctness of every tier, routed by per-tier prices.

With N models whose quality is not ordered by cost (RouterBench: Llama-2-70B below Mixtral-8x7B on ARC), a
single difficulty score cut into N intervals sends a query to the next tier up whether or not that model
is the one likely to answer it. This router predicts, for each prompt x and tier k, the probability
``p_k(x)`` that tier k answers it well, and sends x to

    tier(x) = argmax_k  p_k(x) - lambda_k,      lambda_0 = 0,

where the prices ``lambda`` are set so that the calibration prompts (the whole profile, as for the ladder's
thresholds) split over the tiers in the requested load shares. So the optimiser's knobs are unchanged:
N load fractions per tier, mapped to N-1 prices as the ladder maps them to N-1 thresholds. With shares
fixed, this assignment maximises the summed predicted correctness (the prices are the dual variables of
the per-tier capacity constraints of that assignment problem).

The model of ``p_k`` (format ``boute-multi-router/2``): a two-parameter item-response model on one
learned difficulty,

    d(x) = E[level | x] / (N - 1),        p_k(x) = sigmoid(a_k + b_k d(x)),

where the level head is the ladder router's (multinomial logistic regression on the static prompt embedding +
the 7 shape features, C by 5-fold CV, label: the smallest tier as good as the best on that query) and each
tier's ability ``a_k`` and discrimination ``b_k`` are fitted on the training rows' out-of-fold difficulties
(5-fold cross-fitting, so the calibration sees scores as unseen prompts get them). Tiers whose curves cross
are routed out of cost order (a tier that is never the best per price is never chosen), which a ladder cannot
do. Why not one free head per tier (``boute-multi-router/1``, still loaded): on RouterBench's ARC split (713
training rows) the N independent heads each fit their own noise, and their differences, which are what the
argmax reads, are mostly that noise: held-out APGR 0.44 (3 tiers) and 0.57 (4 tiers) against the ladder's
0.50 and 0.65; damped per-tier residuals on top of the shared difficulty lost too (0.43-0.49, 0.57-0.60). The
item-response model reaches the ladder's APGR (0.513 and 0.654 held out; 0.494 and 0.566 on RouterBench's
separate test file, the ladder 0.491 and 0.566; ``python -m bench quality_routers``): the per-query signal on
this data is one difficulty.

Prices for given shares (:func:`prices_for_shares`): coordinate descent on the dual

    g(lambda) = sum_i max_k (p_ik - lambda_k) + sum_k n_k lambda_k,

whose minimisers are exactly the prices under which the n_k prompts per tier maximise the summed predicted
correctness. For tier k, its margin on prompt i is ``p_ik - max_{j != k} (p_ij - lambda_j)``; tier k wins
exactly the prompts whose margin exceeds lambda_k, so setting lambda_k halfway between the n_k-th and
(n_k+1)-th largest margins is the exact minimum of g along lambda_k. Every used tier is updated in a sweep,
the first one too, and the prices are then shifted so that the first used tier's is 0 (only differences
matter). Updating the anchor matters: it is the move of all the other prices together, and without it the
descent stalls on g's kinks (a piecewise-linear g has points where no single other price improves it):
RouterBench's 3-tier predictions with random shares needed a median 7 and a p99 of 130+ sweeps, some not
converging in 200; with it, a median 3 and at most 5. Sweeps stop when every count equals its target, or
when a sweep leaves the prices where they were (prompts with identical predictions cannot be split by any
price: the counts then stay as near as those ties allow), or after ``MAX_SWEEPS``. With exact counts the
calibration prompts' assignment is the assignment problem's optimum, unique for predictions in general
position, so the result does not depend on where the descent started. A tier with share 0 gets price +inf
(never chosen). About 0.1 ms a sweep for a thousand prompts and N <= 5.

Scoring one live prompt costs the ladder's embedding plus N dot products: proxy speed.

Files (what a plan bundles, as for the ladder router, :mod:`boute.quality.router`): ``<out>`` the weights
(``.npz``: the level head ``coef`` (K, d), ``intercept`` (K,), ``classes`` (K,), the per-tier ``calib`` (N, 2)
and the shape standardisation; format /1: the N heads stacked, no ``calib``), the static
embedder's table and tokenizer beside it (named by their content: shared with a ladder saved in the same
folder), and ``<out>.json``: metadata (format ``boute-multi-router/1``, tiers,
split, embedder) with every other file's sha256, so :func:`load_multi_router` refuses a missing or altered one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from boute.errors import SpecError
from boute.quality.head import N_SHAPE, LinearHead, fit_head, meta_path, read_metadata, shape_features, verify_files
from boute.quality.profiles import QualityProfile
from boute.quality.static_embed import StaticEmbedder, static_from_metadata
from boute.specs.io import write_atomic

MAX_SWEEPS = 200
MULTI_FORMAT = "boute-multi-router/2"
MULTI_FORMATS = (MULTI_FORMAT, "boute-multi-router/1")  # /1: one independent head per tier
CV_FOLDS = 5


@dataclass(frozen=True)
class MultiRouter:
    """Per-tier predicted correctness from one linear layer on static embeddings + standardised shape features.

    ``calib`` (N, 2) set: the item-response model of the module doc (``coef`` is the level head, K levels,
    ``classes`` their values); ``calib`` None: format /1, one binary head per tier (row k of ``coef``)."""

    tiers: tuple[str, ...]
    coef: np.ndarray
    intercept: np.ndarray
    feat_mean: np.ndarray
    feat_std: np.ndarray
    static: StaticEmbedder
    classes: np.ndarray | None = None
    calib: np.ndarray | None = None
    good_threshold: float = 0.5
    metadata: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None  # set once saved or loaded: then :meth:`files` lists what a bundle copies

    def features(self, prompts: Sequence[str], emb: np.ndarray | None = None) -> np.ndarray:
        e = self.static.embed(prompts) if emb is None else emb
        shape = (shape_features(prompts) - self.feat_mean) / self.feat_std
        return np.hstack([np.asarray(e, np.float64), shape])

    def difficulty(self, x: np.ndarray) -> np.ndarray:
        """d(x) = E[level | x] / (N - 1) from the level head (format /2)."""
        assert self.classes is not None
        head = LinearHead(self.coef, self.intercept, self.classes)
        return head.expected(x, len(self.tiers) - 1)

    def score(self, prompts: Sequence[str]) -> np.ndarray:
        """Difficulty of ``prompts`` in [0, 1] (format /2): the ladder router's score on the same rows, what the
        gateway records for the re-plan loop."""
        return self.difficulty(self.features(prompts))

    def predict(self, prompts: Sequence[str], emb: np.ndarray | None = None) -> np.ndarray:
        """(n, N): predicted probability that each tier's answer is good (score >= good_threshold)."""
        x = self.features(prompts, emb)
        if self.calib is None:
            return _sigmoid(x @ self.coef.T + self.intercept)
        return irt_correctness(self.difficulty(x), self.calib)

    def files(self) -> list[Path]:
        """Every file needed to load this router: weights, metadata, static table, tokenizer (hashes in the
        metadata)."""
        if self.path is None:
            raise SpecError(None, "router", "the multi router has not been saved: no files yet")
        extra = [self.path.with_name(v["name"]) for k, v in self.metadata["files"].items() if k != "weights"]
        return [self.path, meta_path(self.path), *extra]

    def save(self, path: str | Path) -> MultiRouter:
        """Weights, then table and tokenizer, then the metadata naming them all with their sha256 (each file
        atomically, metadata last: a reader that finds the metadata finds the rest). Returns the saved router."""
        p = Path(path)
        buf = io.BytesIO()
        arrays = {
            "coef": self.coef,
            "intercept": self.intercept,
            "feat_mean": self.feat_mean,
            "feat_std": self.feat_std,
        }
        if self.calib is not None and self.classes is not None:
            arrays |= {"calib": self.calib, "classes": self.classes}
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        write_atomic(p, buf.getvalue())
        written = {"weights": (p, hashlib.sha256(buf.getvalue()).hexdigest()), **self.static.save_shared(p.parent)}
        meta = {
            **self.metadata,
            "format": MULTI_FORMAT if self.calib is not None else MULTI_FORMATS[1],
            "tiers": list(self.tiers),
            "n_tiers": len(self.tiers),
            "good_threshold": self.good_threshold,
            "embedder": {
                "kind": "static",
                **self.static.info,
                "max_tokens": self.static.max_tokens,
                "dim": self.static.dim,
            },
            "files": {role: {"name": f.name, "sha256": digest} for role, (f, digest) in written.items()},
        }
        write_atomic(meta_path(p), json.dumps(meta, indent=2) + "\n")
        return dataclasses.replace(self, metadata=meta, path=p)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def irt_correctness(d: np.ndarray, calib: np.ndarray) -> np.ndarray:
    """(n, N): sigmoid(a_k + b_k d_i) for difficulties ``d`` (n,) and ``calib`` rows (a_k, b_k)."""
    c = np.asarray(calib, np.float64)
    return _sigmoid(c[:, 0][None, :] + np.asarray(d, np.float64).reshape(-1, 1) * c[:, 1][None, :])


def load_multi_router(path: str | Path) -> MultiRouter:
    """A multi router saved by :meth:`MultiRouter.save`, every listed file's hash checked (SpecError naming
    the file and field otherwise). Imports numpy and ``tokenizers`` only: the gateway loads it."""
    p = Path(path)
    meta = read_metadata(p, MULTI_FORMATS)
    files = verify_files(p, meta, ("weights", "table", "tokenizer"))
    if files["weights"] != p:
        raise SpecError(meta_path(p), "files.weights.name", f"names {files['weights'].name}, not {p.name}")
    v2 = meta.get("format") == MULTI_FORMAT
    try:
        with np.load(p, allow_pickle=False) as z:
            coef, intercept, mean, std = z["coef"], z["intercept"], z["feat_mean"], z["feat_std"]
            classes, calib = (z["classes"], z["calib"]) if v2 else (None, None)
    except (OSError, ValueError, KeyError) as exc:
        raise SpecError(p, None, f"not a saved multi router ({exc})") from None
    tiers = tuple(str(t) for t in meta.get("tiers", []))
    static = static_from_metadata(files, meta["embedder"])
    rows = coef.shape[0] if v2 else len(tiers)  # the level head's K rows (1 for two levels), or one per tier
    if coef.shape != (rows, static.dim + N_SHAPE) or intercept.shape != (rows,):
        raise SpecError(
            p, "coef", f"shape {coef.shape} does not fit {len(tiers)} tiers of {static.dim + N_SHAPE} features"
        )
    if calib is not None and calib.shape != (len(tiers), 2):
        raise SpecError(p, "calib", f"shape {calib.shape}, expected ({len(tiers)}, 2)")
    good = float(meta.get("good_threshold", 0.5))
    return MultiRouter(tiers, coef, intercept, mean, std, static, classes, calib, good, meta, p)


def train_multi_router(
    profile: QualityProfile,
    tier_models: Sequence[str],
    train: np.ndarray,
    static: StaticEmbedder,
    *,
    seed: int = 0,
    good_threshold: float = 0.5,
    level_head: tuple[LinearHead, float] | None = None,
) -> MultiRouter:
    """Fit the level head on the ``train`` rows, then each tier's (a_k, b_k) on their out-of-fold difficulty
    (label: that tier's score >= ``good_threshold``); module doc.

    ``level_head``: (head, C) of a ladder router trained by :func:`boute.quality.router.train_router` on these
    tiers, ``static``, ``train`` rows and ``seed`` with relative labels: that is this very fit (same features,
    levels, rows and cross-validation), so it is taken instead of repeated."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import KFold

    from boute.quality.router import difficulty_levels

    cols = [profile.models.index(m) for m in tier_models]
    good = profile.scores[:, cols] >= good_threshold
    for k, m in enumerate(tier_models):
        if good[train, k].min() == good[train, k].max():
            raise SpecError(
                profile.source, f"models.{m}", "every training query has the same outcome: nothing to learn"
            )
    emb = static.embed(profile.prompts)
    shape = shape_features(profile.prompts)
    mean, std = shape[train].mean(axis=0), shape[train].std(axis=0)
    std = np.where(std > 0, std, 1.0)
    x = np.hstack([np.asarray(emb, np.float64), (shape - mean) / std])
    levels = difficulty_levels(profile.scores[:, cols], "relative")
    top = len(tier_models) - 1
    head, c = level_head if level_head is not None else fit_head(x[train], levels[train], seed)
    d_oof = np.empty(len(train))
    for fit_rows, out_rows in KFold(CV_FOLDS, shuffle=True, random_state=seed).split(train):
        rows = train[fit_rows]
        fold = fit_head(x[rows], levels[rows], seed, c=c)[0] if np.unique(levels[rows]).size > 1 else head
        d_oof[out_rows] = fold.expected(x[train[out_rows]], top)  # classes are level values: one scale
    calib = np.zeros((len(tier_models), 2))
    for k in range(len(tier_models)):
        lr = LogisticRegression(C=1.0).fit(d_oof.reshape(-1, 1), good[train, k].astype(np.int64))
        calib[k] = (float(lr.intercept_[0]), float(lr.coef_[0, 0]))
    meta = {
        "kind": "item-response model on one learned difficulty: sigmoid(a_k + b_k d(x)), d from a level head on "
        "static prompt embeddings + 7 prompt-shape features",
        "C": c,
        "calib": calib.tolist(),
        "profile": {"source": profile.source, "hash": profile.content_hash, "n": len(profile)},
        "train_rows": int(len(train)),
    }
    return MultiRouter(
        tuple(tier_models), head.coef, head.intercept, mean, std, static, head.classes, calib, good_threshold, meta
    )


def route(p: np.ndarray, prices: ArrayLike) -> np.ndarray:
    """Tier per prompt: argmax_k p_k - lambda_k (ties to the lower tier)."""
    return np.argmax(np.asarray(p, np.float64) - np.asarray(prices, np.float64)[None, :], axis=1)


def share_counts(fractions: ArrayLike, m: int) -> np.ndarray:
    """Integer prompt counts per tier summing to m (largest remainders)."""
    f = np.asarray(fractions, np.float64).reshape(-1)
    if (f < -1e-12).any() or not math.isclose(float(f.sum()), 1.0, abs_tol=1e-6):
        raise ValueError(f"fractions must be >= 0 and sum to 1, got {f.tolist()}")
    raw = np.maximum(f, 0.0) / f.sum() * m
    n = np.floor(raw).astype(np.int64)
    n[np.argsort(-(raw - n), kind="stable")[: m - int(n.sum())]] += 1
    return n


def prices_for_shares(p_cal: np.ndarray, fractions: ArrayLike, start: ArrayLike | None = None) -> np.ndarray:
    """Prices lambda (len N, lambda of the first used tier 0) giving ``fractions`` of ``p_cal``'s prompts to
    each tier under :func:`route` (module doc: coordinate descent on the assignment dual). ``start``: prices
    to descend from (a nearby policy's: one or two sweeps instead of three or four from zero); entries of
    tiers unused here or not finite are ignored."""
    p = np.asarray(p_cal, np.float64)
    m, n_tiers = p.shape
    want = share_counts(fractions, m)
    lam = np.zeros(n_tiers)
    lam[want == 0] = np.inf
    used = np.flatnonzero(want > 0)
    if used.size == 1:
        return lam
    q, n = p[:, used], want[used]  # a tier priced +inf never wins: only the used ones take part
    cols = [np.ascontiguousarray(q[:, j]) for j in range(used.size)]  # 1-D columns: the sweep's fast path
    mu = np.zeros(used.size)
    if start is not None:
        s0 = np.asarray(start, np.float64).reshape(-1)[used]
        if np.isfinite(s0).all():
            mu = s0 - s0[0]
    for _ in range(MAX_SWEEPS):
        before = mu.copy()
        for j in range(used.size):
            rival: np.ndarray | None = None  # max_{i != j} (p_i - mu_i)
            for i in range(used.size):
                if i != j:
                    x = cols[i] - mu[i]
                    rival = x if rival is None else np.maximum(rival, x, out=rival)
            assert rival is not None
            margin = cols[j] - rival
            nk = int(n[j])
            if nk < m:  # the nk-th and (nk+1)-th largest margins: a partition, not a sort (this runs per policy)
                part = np.partition(margin, (m - nk - 1, m - nk))
                mu[j] = (part[m - nk - 1] + part[m - nk]) / 2.0
            else:
                mu[j] = float(margin.min()) - 1.0
        mu -= mu[0]
        if np.array_equal(np.bincount(route(q, mu), minlength=used.size), n) or np.array_equal(mu, before):
            break
    lam[used] = mu
    return lam
