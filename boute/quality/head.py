"""The linear scoring model the pre-router and the cascade verifier share, and its files.

A prompt's features are its embedding plus seven prompt-shape features (:func:`shape_features`); a
:class:`LinearHead` (logistic or softmax regression, fitted by :func:`fit_head`) turns them into class
probabilities. Both models are saved as an ``.npz`` of weights (numpy only, no pickle) with a ``.json``
metadata file beside it that lists every other file with its sha256 (:func:`verify_files`), so a plan
bundle can move them together and a loader refuses a missing or altered one. What the scores mean and how
the models are trained live in :mod:`boute.quality.router` and :mod:`boute.quality.judges`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from boute.errors import SpecError
from boute.specs.io import sha256_file

N_SHAPE = 7
_NUM = re.compile(r"\d+(?:[.,]\d+)?")
_FRACTION = re.compile(r"\d+\s*/\s*\d+")


def shape_row(t: str) -> tuple[float, ...]:
    """One prompt's seven shape features, in plain Python: ~5 us, a tenth of a static score, so the two
    precompiled regexes stay (a numpy row per prompt would cost more than the regexes themselves)."""
    nums = _NUM.findall(t)
    return (
        math.log1p(len(t)),
        float(len(nums)),
        math.log1p(sum(map(len, nums))),
        float(t.count(".") + t.count("?")),
        float(t.count("%")),
        float(t.count("$")),
        float(len(_FRACTION.findall(t))),
    )


def shape_features(prompts: Sequence[str]) -> np.ndarray:
    """Seven cheap prompt-shape features (unstandardised): multi-step problems are longer, more numeric."""
    return np.array([shape_row(t) for t in prompts], dtype=np.float64).reshape(len(prompts), N_SHAPE)


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


def fit_head(x: np.ndarray, y: np.ndarray, seed: int = 0, c: float | None = None) -> tuple[LinearHead, float]:
    """Logistic regression with C picked by 5-fold CV on the training rows (or ``c`` as given: a refit on
    part of the rows at the C chosen on all of them); returns (head, chosen C).

    Solver: Newton-CG. The features (embeddings and their products, ~1,200 columns) outnumber a profile's
    training rows, so weakly regularised fits are nearly separable and L-BFGS needs 50-140 iterations
    each; Newton-CG reaches the same optimum (the objective is strictly convex) in ~7. The 25 fits of a
    cascade verifier on GSM8K took 15 s, now 0.8 s, with the same C and the same CV scores to 1e-3.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise SpecError(None, "labels", f"all training queries have the same label ({classes[0]}): nothing to learn")
    folds = int(min(5, counts.min()))
    best_c, best = (1.0, -np.inf) if c is None else (c, np.inf)
    if folds >= 2 and c is None:
        cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        scoring = "roc_auc" if len(classes) == 2 else "neg_log_loss"
        for cand in (0.1, 0.3, 1.0, 3.0, 10.0):
            model = LogisticRegression(C=cand, max_iter=2000, solver="newton-cg")
            s = cross_val_score(model, x, y, cv=cv, scoring=scoring).mean()
            if s > best + 1e-9:
                best_c, best = cand, s
    clf = LogisticRegression(C=best_c, max_iter=2000, solver="newton-cg").fit(x, y)
    head = LinearHead(np.asarray(clf.coef_, np.float64), np.asarray(clf.intercept_, np.float64), clf.classes_.copy())
    return head, best_c


def meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def read_metadata(path: str | Path, expected_format: str | tuple[str, ...]) -> dict[str, Any]:
    """``<path>.json``, checked for the format (the weights file must exist too)."""
    p = Path(path)
    formats = (expected_format,) if isinstance(expected_format, str) else expected_format
    if not p.is_file():
        raise SpecError(p, None, "file not found")
    mp = meta_path(p)
    if not mp.is_file():
        raise SpecError(mp, None, "metadata file not found (it is written next to the weights)")
    try:
        meta = json.loads(mp.read_text())
    except json.JSONDecodeError as exc:
        raise SpecError(mp, f"line {exc.lineno}", f"malformed JSON: {exc.msg}") from None
    if not isinstance(meta, dict) or meta.get("format") not in formats:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise SpecError(mp, "format", f"expected '{formats[0]}', got {got!r}")
    return meta


def verify_files(path: Path, meta: dict[str, Any], required: Sequence[str]) -> dict[str, Path]:
    """The metadata's ``files`` as paths beside ``path``, each present with the recorded sha256.

    Names must be bare file names (a bundle moves the files together; a path could point anywhere)."""
    mp = meta_path(path)
    files = meta.get("files")
    if not isinstance(files, dict):
        raise SpecError(mp, "files", "missing: this router format lists its files with their sha256")
    for role in required:
        if role not in files:
            raise SpecError(mp, f"files.{role}", "missing: the router needs this file")
    out: dict[str, Path] = {}
    for role, entry in files.items():
        name, digest = (entry.get("name"), entry.get("sha256")) if isinstance(entry, dict) else (None, None)
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise SpecError(mp, f"files.{role}.name", f"must be a file name beside the router, got {name!r}")
        if not isinstance(digest, str) or len(digest) != 64:
            raise SpecError(mp, f"files.{role}.sha256", f"must be a 64-hex-digit sha256, got {digest!r}")
        f = path.with_name(name)
        if not f.is_file():
            raise SpecError(f, f"files.{role}", f"file not found (listed in {mp.name}; it is saved beside the router)")
        got = sha256_file(f)
        if got != digest:
            raise SpecError(
                f, f"files.{role}.sha256", f"hash mismatch: {mp.name} says {digest[:12]}..., file has {got[:12]}..."
            )
        out[role] = f
    return out


def read_weights(p: Path) -> tuple[LinearHead, dict[str, np.ndarray]]:
    try:
        with np.load(p, allow_pickle=False) as z:
            head = LinearHead(z["coef"], z["intercept"], z["classes"])
            extra = {k: z[k] for k in z.files if k not in ("coef", "intercept", "classes")}
    except (OSError, ValueError, KeyError) as exc:
        raise SpecError(p, None, f"not a saved weights file ({exc})") from None
    if head.coef.ndim != 2 or head.intercept.shape[0] != head.coef.shape[0]:
        raise SpecError(p, "coef", f"inconsistent weight shapes {head.coef.shape} / {head.intercept.shape}")
    return head, extra


def load_head(
    path: str | Path, expected_format: str | tuple[str, ...]
) -> tuple[LinearHead, dict[str, Any], dict[str, np.ndarray]]:
    """Weights + metadata of a linear model saved by :meth:`Router.save` (router or verifier)."""
    meta = read_metadata(path, expected_format)
    head, extra = read_weights(Path(path))
    return head, meta, extra
