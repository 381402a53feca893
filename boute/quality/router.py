"""The learned pre-router: a linear classifier on prompt embeddings that scores query difficulty.

Label, for tiers ordered small -> large: a query's *level* is the smallest tier that is good enough.
``label="relative"`` (default): good enough = as good as the best tier on that query (within
``good_margin``), so a query that every tier fails does not ask for a larger model; with two binary
tiers the label is "only the large model is right". ``label="absolute"``: good enough = normalised score
>= ``good_threshold`` (on GSM8K: "the small model is correct"). On GSM8K the relative label routes
better (5-fold CV: APGR 0.65 vs 0.62 with the same features), see docs/quality.md.

Features: the prompt embedding (see Embedders) plus seven standardised prompt-shape features (length, how
many numbers, digits, sentences, percent/dollar signs, fractions): on GSM8K the MiniLM embedding alone
reaches a CV AUC of 0.57, with the shape features 0.61. A (multinomial) logistic regression predicts the level; the
difficulty score is its expected value scaled to [0, 1], so one score orders queries for any number of
tiers and thresholds on it split traffic between them.

Embedders (``metadata["embedder"]["kind"]``): ``static`` (default; token vectors distilled offline from
MiniLM by model2vec, see :mod:`boute.quality.static_embed`: ~0.2 ms per prompt, numpy + ``tokenizers``
only) or ``minilm`` (the transformer itself, ~15-20 ms of CPU per prompt, needs torch). Both reach the
same held-out APGR within noise; the figures are in docs/quality.md and bench/results/router_speed.json.

A router is persisted as files side by side, named after ``<out>``:

- ``<out>``: the weights (``.npz``: numpy only, no pickle, so the gateway loads it without scikit-learn);
- ``static-<hash>.npy`` + ``static-<hash>.tokenizer.json``: the static embedder's table and tokenizer (static
  only), named by their content, so the routers and verifiers of one folder share one copy
  (:meth:`~boute.quality.static_embed.StaticEmbedder.save_shared`; before, ``<out>.static.npy`` and
  ``<out>.tokenizer.json``, which still load: a model's metadata names its files);
- ``<out>.json``: metadata (tiers, embedder settings, profile and held-out split, test metrics) and
  ``files``: ``{role: {"name", "sha256"}}`` for every other file, so a plan bundle can copy them and
  :func:`load_router` refuses a missing or altered one. ``Router.files()`` lists all of them.

Routers saved before the static embedder (``boute-router/1``: MiniLM, no ``files``) still load.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from boute.errors import SpecError
from boute.quality.head import (
    N_SHAPE,
    LinearHead,
    fit_head,
    meta_path,
    read_metadata,
    read_weights,
    shape_features,
    shape_row,
    verify_files,
)
from boute.quality.profiles import QualityProfile
from boute.quality.static_embed import StaticEmbedder, static_from_metadata
from boute.specs.io import write_atomic

ROUTER_FORMAT = "boute-router/2"
LEGACY_FORMATS = ("boute-router/1",)  # MiniLM routers without a ``files`` list
EMBED_FEATURES = 384 + N_SHAPE  # MiniLM embedding + shape features
EMBEDDERS = ("static", "minilm")
DEFAULT_EMBEDDER = "static"


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


def split_indices(
    n: int, test_fraction: float, seed: int, groups: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random train/test split (sorted index arrays) holding out ``round(n * test_fraction)`` rows.

    With ``groups`` (a group id per row: :meth:`QualityProfile.conversation_groups`), whole groups are held out,
    in a seeded random order, until at least that many rows are; every group stays on one side."""
    if not 0 < test_fraction < 1:
        raise SpecError(None, "test_fraction", f"must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    n_test = max(1, round(n * test_fraction))
    if groups is None:
        perm = rng.permutation(n)
        return np.sort(perm[n_test:]), np.sort(perm[:n_test])
    ids, sizes = np.unique(groups, return_counts=True)
    order = rng.permutation(len(ids))
    k = min(int(np.searchsorted(np.cumsum(sizes[order]), n_test)) + 1, max(1, len(ids) - 1))
    held = np.isin(groups, ids[order[:k]])
    return np.flatnonzero(~held), np.flatnonzero(held)


def profile_split(profile: QualityProfile, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`split_indices` of a profile's queries, a recorded conversation's turns kept together."""
    return split_indices(len(profile), test_fraction, seed, profile.conversation_groups())


@dataclass
class Router:
    """Scores prompts by difficulty in [0, 1] (higher = needs a larger tier).

    ``static`` is set for routers on static embeddings; ``path`` once the router is saved or loaded (then
    :meth:`files` can list what it needs).
    """

    head: LinearHead
    feat_mean: np.ndarray
    feat_std: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)
    cache_dir: Path | None = None
    static: StaticEmbedder | None = None
    path: Path | None = None
    _folded: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)

    @property
    def n_tiers(self) -> int:
        return int(self.metadata.get("n_tiers", 2))

    @property
    def cheap(self) -> bool:
        """True for static routers: the gateway scores them inline (~0.2 ms, about what a thread hop costs);
        a MiniLM router (15-20 ms) goes to a worker thread."""
        return self.static is not None

    @property
    def embedder_kind(self) -> str:
        """``static`` or ``minilm`` (routers saved before the static embedder existed are MiniLM)."""
        return str(self.metadata.get("embedder", {}).get("kind", "minilm"))

    def features(self, emb: np.ndarray, prompts: Sequence[str]) -> np.ndarray:
        shape = (shape_features(prompts) - self.feat_mean) / self.feat_std
        return np.hstack([np.asarray(emb, np.float64), shape])

    # ------------------------------------------------------------------------------------------ scoring
    def _weights(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(embedding weights, shape weights, intercept) with the shape standardisation folded in, so
        scoring is two dot products and no per-call (x - mean) / std."""
        if self._folded is None:
            coef = np.asarray(self.head.coef, np.float64)
            d = coef.shape[1] - N_SHAPE
            w_shape = coef[:, d:] / self.feat_std
            b = np.asarray(self.head.intercept, np.float64) - w_shape @ self.feat_mean
            self._folded = (np.ascontiguousarray(coef[:, :d]), np.ascontiguousarray(w_shape), b)
        return self._folded

    def _expected(self, z: np.ndarray) -> np.ndarray:
        """Logits (n, K) -> expected level / (N-1), as :meth:`LinearHead.expected` does."""
        classes = self.head.classes.astype(np.float64)
        top = max(self.n_tiers - 1, 1)
        if z.shape[1] == 1:
            p1 = 1.0 / (1.0 + np.exp(-z[:, 0]))
            return (classes[0] + (classes[1] - classes[0]) * p1) / top
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return (e @ classes) / e.sum(axis=1) / top

    def score_embeddings(self, emb: np.ndarray, prompts: Sequence[str]) -> np.ndarray:
        """Difficulty from precomputed embeddings of ``prompts`` (the shape features need the text)."""
        w_emb, w_shape, b = self._weights()
        z = np.asarray(emb, np.float64) @ w_emb.T + shape_features(prompts) @ w_shape.T + b
        return self._expected(z)

    def embed(self, prompts: Sequence[str]) -> np.ndarray:
        """This router's embeddings of ``prompts`` (MiniLM: disk-cached for lists of 32+ prompts)."""
        if self.static is not None:
            return self.static.embed(prompts)
        from boute.quality.embed import Embedder

        e = self.metadata.get("embedder", {})
        emb = Embedder(self.cache_dir, max_tokens=int(e.get("max_tokens", 256)), truncate=e.get("truncate", "right"))
        return emb.embed(prompts) if len(prompts) >= 32 else emb.encode(list(prompts))

    def score(self, prompts: Sequence[str]) -> np.ndarray:
        """Difficulty of each prompt in [0, 1] (float64 array, same order)."""
        return self.score_embeddings(self.embed(prompts), prompts)

    def score_one(self, prompt: str) -> float:
        """One live prompt. Static: tokenise, gather, two dot products, ~50 us with no batching machinery;
        equal to ``score([prompt])[0]`` up to float rounding (~1e-16: one row's dot products instead of a
        matrix product)."""
        if self.static is None:
            return float(self.score([prompt])[0])
        w_emb, w_shape, b = self._weights()
        z = w_emb @ self.static.embed_one(prompt).astype(np.float64) + w_shape @ np.array(shape_row(prompt)) + b
        classes, top = self.head.classes, max(self.n_tiers - 1, 1)
        if z.shape[0] == 1:  # binary head: the logistic of one logit
            p1 = 1.0 / (1.0 + math.exp(-float(z[0])))
            return float((classes[0] + (classes[1] - classes[0]) * p1) / top)
        return float(self._expected(z[None, :])[0])

    # -------------------------------------------------------------------------------------------- files
    def files(self) -> list[Path]:
        """Every file needed to load this router: weights, metadata, then the static table and tokenizer.

        A plan bundle copies these side by side; :func:`load_router` checks the hashes recorded in the
        metadata's ``files``."""
        if self.path is None:
            from boute.errors import BouteError

            raise BouteError("router has not been saved: no files yet (call Router.save)")
        roles = self.metadata.get("files", {})
        extra = [self.path.with_name(v["name"]) for k, v in roles.items() if k != "weights"]
        return [self.path, meta_path(self.path), *extra]

    def save(self, path: str | Path) -> Path:
        """Weights to ``path`` (npz), static table + tokenizer beside it, metadata (with every file's sha256)
        to ``path + '.json'`` last, each written atomically: a reader that finds the metadata finds the rest."""

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
        write_atomic(p, buf.getvalue())
        written = {"weights": (p, hashlib.sha256(buf.getvalue()).hexdigest())}
        if self.static is not None:
            written |= self.static.save_shared(p.parent)
        meta = dict(self.metadata)
        meta["files"] = {role: {"name": f.name, "sha256": digest} for role, (f, digest) in written.items()}
        write_atomic(meta_path(p), json.dumps(meta, indent=2) + "\n")
        self.metadata, self.path = meta, p
        return p


def load_router(path: str | Path, cache_dir: Path | None = None) -> Router:
    """A router saved by :func:`train_router` (``boute router train``); every listed file's hash is checked.

    Loading a static router imports numpy and ``tokenizers`` only (no torch, no transformers)."""
    p = Path(path)
    meta = read_metadata(p, (ROUTER_FORMAT, *LEGACY_FORMATS))
    kind = str(meta.get("embedder", {}).get("kind", "minilm"))
    if kind not in EMBEDDERS:
        raise SpecError(meta_path(p), "embedder.kind", f"must be one of {', '.join(EMBEDDERS)}, got {kind!r}")
    files = {"weights": p}
    if meta["format"] == ROUTER_FORMAT:
        files = verify_files(p, meta, ("weights", "table", "tokenizer") if kind == "static" else ("weights",))
        if files["weights"] != p:
            raise SpecError(meta_path(p), "files.weights.name", f"names {files['weights'].name}, not {p.name}")
    elif kind == "static":
        raise SpecError(meta_path(p), "format", f"a static router must be '{ROUTER_FORMAT}'")
    head, extra = read_weights(p)
    if "feat_mean" not in extra or "feat_std" not in extra:
        raise SpecError(p, "feat_mean", "missing from the weights file")
    static = None
    if kind == "static":
        static = static_from_metadata(files, meta["embedder"])
    n_features = (static.dim if static is not None else 384) + N_SHAPE
    if head.coef.shape[1] != n_features:
        raise SpecError(p, "coef", f"expects {head.coef.shape[1]} features, this {kind} router computes {n_features}")
    return Router(head, extra["feat_mean"], extra["feat_std"], meta, cache_dir, static, p)


def train_router(
    profile: QualityProfile,
    tier_models: Sequence[str],
    prompt_emb: np.ndarray | None = None,
    *,
    seed: int = 0,
    test_fraction: float = 0.3,
    label: str = "relative",
    good_threshold: float = 0.5,
    embedder: dict[str, Any] | None = None,
    static: StaticEmbedder | None = None,
) -> tuple[Router, np.ndarray, np.ndarray]:
    """Train on a seeded split; returns (router, train indices, test indices). Test AUC is in metadata.

    With ``static`` the router is a static one (``prompt_emb``, if given, must be ``static``'s embeddings
    of the prompts; by default they are computed, in well under a second); otherwise ``prompt_emb`` are
    MiniLM embeddings (:class:`boute.quality.embed.Embedder`, computed if not given)."""
    t0 = time.perf_counter()
    if prompt_emb is None:
        if static is not None:
            prompt_emb = static.embed(profile.prompts)
        else:
            from boute.quality.embed import Embedder

            prompt_emb = Embedder().embed(profile.prompts)
    dim = static.dim if static is not None else 384
    if prompt_emb.shape != (len(profile), dim):
        raise ValueError(f"prompt embeddings have shape {prompt_emb.shape}, expected ({len(profile)}, {dim})")
    cols = [profile.models.index(m) for m in tier_models]
    levels = difficulty_levels(profile.scores[:, cols], label, good_threshold)
    train, test = profile_split(profile, test_fraction, seed)
    shape = shape_features(profile.prompts)
    mean, std = shape[train].mean(axis=0), shape[train].std(axis=0)
    std = np.where(std > 0, std, 1.0)
    router = Router(LinearHead(np.zeros((1, 1)), np.zeros(1), np.arange(2)), mean, std)
    x = router.features(prompt_emb, profile.prompts)
    head, c = fit_head(x[train], levels[train], seed)
    if static is not None:
        kind = "logistic regression on static (model2vec-distilled MiniLM) prompt embeddings + 7 prompt-shape features"
        emb_meta = {"kind": "static", **static.info, "max_tokens": static.max_tokens, "dim": static.dim}
    else:
        kind = "logistic regression on MiniLM prompt embeddings + 7 prompt-shape features"
        emb_meta = {"kind": "minilm", **(embedder or {"max_tokens": 256, "truncate": "right"})}
    meta: dict[str, Any] = {
        "format": ROUTER_FORMAT,
        "kind": kind,
        "n_tiers": len(tier_models),
        "tiers": list(tier_models),
        "label": label,
        "good_threshold": good_threshold,
        "C": c,
        "embedder": emb_meta,
        "profile": {"source": profile.source, "hash": profile.content_hash, "n": len(profile)},
        "split": {"seed": seed, "test_fraction": test_fraction, "test_indices": test.tolist()},
        "train_seconds": round(time.perf_counter() - t0, 3),
    }
    router = Router(head, mean, std, meta, static=static)
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


def router_files(path: str | Path) -> list[Path]:
    """Every file the router at ``path`` needs (weights first), its hashes checked: what a plan bundle copies."""
    return load_router(path).files()
