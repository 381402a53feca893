"""The learned pre-router: a linear classifier on MiniLM prompt embeddings that scores query difficulty.

Label, for tiers ordered small -> large: a query's *level* is the smallest tier that is good enough.
``label="relative"`` (default): good enough = as good as the best tier on that query (within
``good_margin``), so a query that every tier fails does not ask for a larger model; with two binary
tiers the label is "only the large model is right". ``label="absolute"``: good enough = normalised score
>= ``good_threshold`` (on GSM8K: "the small model is correct"). On GSM8K the relative label routes
better (5-fold CV: APGR 0.65 vs 0.62 with the same features), see docs/quality.md.

Features: the MiniLM embedding plus seven standardised prompt-shape features (length, how many numbers,
digits, sentences, percent/dollar signs, fractions): on GSM8K the embedding alone reaches a CV AUC of
0.57, with the shape features 0.61. A (multinomial) logistic regression predicts the level; the
difficulty score is its expected value scaled to [0, 1], so one score orders queries for any number of
tiers and thresholds on it split traffic between them.

A router is persisted as ``<out>`` (an ``.npz`` with the weights: numpy only, no pickle, so the router
service loads it without scikit-learn) and ``<out>.json`` (metadata: tiers, embedder settings, the
profile it was trained on and the held-out split, test metrics).
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from boute.errors import SpecError
from boute.quality.profiles import QualityProfile

ROUTER_FORMAT = "boute-router/1"
EMBED_FEATURES = 384 + 7  # MiniLM embedding + shape features


_NUM = re.compile(r"\d+(?:[.,]\d+)?")


def shape_features(prompts: Sequence[str]) -> np.ndarray:
    """Seven cheap prompt-shape features (unstandardised): multi-step problems are longer, more numeric."""
    rows = []
    for t in prompts:
        nums = _NUM.findall(t)
        rows.append(
            [
                np.log1p(len(t)),
                len(nums),
                np.log1p(sum(len(n) for n in nums)),
                t.count(".") + t.count("?"),
                t.count("%"),
                t.count("$"),
                len(re.findall(r"\d+\s*/\s*\d+", t)),
            ]
        )
    return np.asarray(rows, dtype=np.float64).reshape(len(prompts), 7)


@dataclass(frozen=True)
class LinearHead:
    """Softmax/logistic regression weights: ``classes`` (levels) x features."""

    coef: np.ndarray
    intercept: np.ndarray
    classes: np.ndarray

    def proba(self, x: np.ndarray) -> np.ndarray:
        z = x @ self.coef.T + self.intercept
        if self.coef.shape[0] == 1:  # binary: sklearn stores one row for the positive class
            p1 = 1.0 / (1.0 + np.exp(-z[:, 0]))
            return np.stack([1.0 - p1, p1], axis=1)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def expected(self, x: np.ndarray, top: float) -> np.ndarray:
        """Expected class value / top: a score in [0, 1]."""
        return (self.proba(x) @ self.classes.astype(np.float64)) / max(top, 1.0)


def fit_head(x: np.ndarray, y: np.ndarray, seed: int = 0) -> tuple[LinearHead, float]:
    """Logistic regression with C picked by 5-fold CV on the training rows; returns (head, chosen C)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise SpecError(None, "labels", f"all training queries have the same label ({classes[0]}): nothing to learn")
    folds = int(min(5, counts.min()))
    best_c, best = 1.0, -np.inf
    if folds >= 2:
        cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        scoring = "roc_auc" if len(classes) == 2 else "neg_log_loss"
        for c in (0.1, 0.3, 1.0, 3.0, 10.0):
            s = cross_val_score(LogisticRegression(C=c, max_iter=2000), x, y, cv=cv, scoring=scoring).mean()
            if s > best + 1e-9:
                best_c, best = c, s
    clf = LogisticRegression(C=best_c, max_iter=2000).fit(x, y)
    head = LinearHead(np.asarray(clf.coef_, np.float64), np.asarray(clf.intercept_, np.float64), clf.classes_.copy())
    return head, best_c


def difficulty_levels(
    scores: np.ndarray, label: str = "relative", good_threshold: float = 0.5, good_margin: float = 0.0
) -> np.ndarray:
    """Per query, the index of the smallest tier that is good enough (top tier if none is)."""
    if label == "relative":
        good = scores >= scores.max(axis=1, keepdims=True) - good_margin - 1e-12
    elif label == "absolute":
        good = scores >= good_threshold
    else:
        raise SpecError(None, "label", f"must be 'relative' or 'absolute', got '{label}'")
    good[:, -1] = True
    return np.argmax(good, axis=1)


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random train/test split (sorted index arrays)."""
    if not 0 < test_fraction < 1:
        raise SpecError(None, "test_fraction", f"must be in (0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, round(n * test_fraction))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


@dataclass
class Router:
    """Scores prompts by difficulty in [0, 1] (higher = needs a larger tier)."""

    head: LinearHead
    feat_mean: np.ndarray
    feat_std: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)
    cache_dir: Path | None = None

    @property
    def n_tiers(self) -> int:
        return int(self.metadata.get("n_tiers", 2))

    def features(self, emb: np.ndarray, prompts: Sequence[str]) -> np.ndarray:
        shape = (shape_features(prompts) - self.feat_mean) / self.feat_std
        return np.hstack([np.asarray(emb, np.float64), shape])

    def score_embeddings(self, emb: np.ndarray, prompts: Sequence[str]) -> np.ndarray:
        """Difficulty from precomputed embeddings of ``prompts`` (the shape features need the text)."""
        return self.head.expected(self.features(emb, prompts), self.n_tiers - 1)

    def score(self, prompts: Sequence[str]) -> np.ndarray:
        """Embed (cached on disk for lists of 32+ prompts; a live request is not worth a file) and score."""
        from boute.quality.embed import Embedder

        e = self.metadata.get("embedder", {})
        emb = Embedder(self.cache_dir, max_tokens=int(e.get("max_tokens", 256)), truncate=e.get("truncate", "right"))
        x = emb.embed(prompts) if len(prompts) >= 32 else emb.encode(list(prompts))
        return self.score_embeddings(x, prompts)

    def save(self, path: str | Path) -> Path:
        """Weights to ``path`` (npz) and metadata to ``path + '.json'``, each written atomically."""
        from boute.specs.io import write_atomic

        p = Path(path)
        buf = io.BytesIO()
        np.savez(
            buf,
            coef=self.head.coef,
            intercept=self.head.intercept,
            classes=self.head.classes,
            feat_mean=self.feat_mean,
            feat_std=self.feat_std,
        )
        _write_bytes_atomic(p, buf.getvalue())
        write_atomic(meta_path(p), json.dumps(self.metadata, indent=2) + "\n")
        return p


def meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_head(path: str | Path, expected_format: str) -> tuple[LinearHead, dict[str, Any], dict[str, np.ndarray]]:
    p = Path(path)
    if not p.is_file():
        raise SpecError(p, None, "file not found")
    mp = meta_path(p)
    if not mp.is_file():
        raise SpecError(mp, None, "metadata file not found (it is written next to the weights)")
    try:
        meta = json.loads(mp.read_text())
    except json.JSONDecodeError as exc:
        raise SpecError(mp, f"line {exc.lineno}", f"malformed JSON: {exc.msg}") from None
    if not isinstance(meta, dict) or meta.get("format") != expected_format:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise SpecError(mp, "format", f"expected '{expected_format}', got {got!r}")
    try:
        with np.load(p, allow_pickle=False) as z:
            head = LinearHead(z["coef"], z["intercept"], z["classes"])
            extra = {k: z[k] for k in z.files if k not in ("coef", "intercept", "classes")}
    except (OSError, ValueError, KeyError) as exc:
        raise SpecError(p, None, f"not a saved weights file ({exc})") from None
    if head.coef.ndim != 2 or head.intercept.shape[0] != head.coef.shape[0]:
        raise SpecError(p, "coef", f"inconsistent weight shapes {head.coef.shape} / {head.intercept.shape}")
    return head, meta, extra


def load_router(path: str | Path, cache_dir: Path | None = None) -> Router:
    """A router saved by :func:`train_router` (``boute router train``)."""
    head, meta, extra = load_head(path, ROUTER_FORMAT)
    if "feat_mean" not in extra or "feat_std" not in extra:
        raise SpecError(path, "feat_mean", "missing from the weights file")
    if head.coef.shape[1] != EMBED_FEATURES:
        raise SpecError(path, "coef", f"expects {head.coef.shape[1]} features, this version computes {EMBED_FEATURES}")
    return Router(head, extra["feat_mean"], extra["feat_std"], meta, cache_dir)


def train_router(
    profile: QualityProfile,
    tier_models: Sequence[str],
    prompt_emb: np.ndarray,
    *,
    seed: int = 0,
    test_fraction: float = 0.3,
    label: str = "relative",
    good_threshold: float = 0.5,
    embedder: dict[str, Any] | None = None,
) -> tuple[Router, np.ndarray, np.ndarray]:
    """Train on a seeded split; returns (router, train indices, test indices). Test AUC is in metadata."""
    t0 = time.perf_counter()
    cols = [profile.models.index(m) for m in tier_models]
    levels = difficulty_levels(profile.scores[:, cols], label, good_threshold)
    train, test = split_indices(len(profile), test_fraction, seed)
    shape = shape_features(profile.prompts)
    mean, std = shape[train].mean(axis=0), shape[train].std(axis=0)
    std = np.where(std > 0, std, 1.0)
    router = Router(LinearHead(np.zeros((1, 1)), np.zeros(1), np.arange(2)), mean, std)
    x = router.features(prompt_emb, profile.prompts)
    head, c = fit_head(x[train], levels[train], seed)
    meta: dict[str, Any] = {
        "format": ROUTER_FORMAT,
        "kind": "logistic regression on MiniLM prompt embeddings + 7 prompt-shape features",
        "n_tiers": len(tier_models),
        "tiers": list(tier_models),
        "label": label,
        "good_threshold": good_threshold,
        "C": c,
        "embedder": embedder or {"max_tokens": 256, "truncate": "right"},
        "profile": {"source": profile.source, "hash": profile.content_hash, "n": len(profile)},
        "split": {"seed": seed, "test_fraction": test_fraction, "test_indices": test.tolist()},
        "train_seconds": round(time.perf_counter() - t0, 3),
    }
    router = Router(head, mean, std, meta)
    s = router.head.expected(x, len(tier_models) - 1)
    hard = levels > 0  # "the smallest tier is not good enough"
    meta["test_auc"], meta["train_auc"] = _auc(s[test], hard[test]), _auc(s[train], hard[train])
    return router, train, test


def _auc(score: np.ndarray, positive: np.ndarray) -> float | None:
    """ROC AUC by ranks (ties averaged); None when one class is absent."""
    from scipy.stats import rankdata

    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    r = rankdata(score)
    return round(float((r[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)), 4)
