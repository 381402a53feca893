"""The routers a quality model trains on a profile, cached on disk: the ladder (and its held-out split) and the
multi router.

Training depends on nothing but the profile's content, the tier models, the rows and the seed, so each router
is kept beside the embeddings (``<cache>/routers/``), named by a hash of those, and a second build reuses it;
a damaged entry is retrained. A router a scenario names (``quality.router``) is loaded instead of trained.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from boute.data import cache_dir as default_cache_dir
from boute.data.builds import building
from boute.errors import SpecError
from boute.quality.multi import MULTI_FORMAT, MultiRouter, load_multi_router, train_multi_router
from boute.quality.profiles import QualityProfile
from boute.quality.router import ROUTER_FORMAT, Router, load_router, profile_split, train_router
from boute.quality.static_embed import load_static


@dataclass(frozen=True)
class LadderFit:
    """The ladder router a quality model starts from, with the profile rows it was trained on and held out.

    ``trained_here``: trained (or reused from the cache) on this very split, rather than loaded from a file
    the scenario names; only then is its level head the multi router's too (:func:`trained_multi_router`)."""

    router: Router
    train: np.ndarray
    test: np.ndarray
    file: Path
    trained_here: bool


def ladder_fit(
    profile: QualityProfile,
    models: list[str],
    router_path: Path | None,
    cache_dir: Path | None,
    seed: int,
    test_fraction: float,
) -> LadderFit:
    """The ladder: loaded from ``router_path`` (checked to route these tiers) or trained here.

    A loaded router trained on this profile's content keeps its own held-out rows; one trained on other data
    holds out every query of this profile (the training rows are then the seeded split's, for the verifier)."""
    if router_path is None:
        router, train, test, path = trained_ladder(profile, models, cache_dir, seed, test_fraction)
        return LadderFit(router, train, test, path, trained_here=True)
    router = load_router(router_path, cache_dir)
    if router.n_tiers != len(models):
        raise SpecError(
            router_path, "n_tiers", f"router was trained for {router.n_tiers} tiers, scenario has {len(models)}"
        )
    split = router.metadata.get("split", {})
    if router.metadata.get("profile", {}).get("hash") == profile.content_hash and "test_indices" in split:
        test = np.asarray(split["test_indices"], dtype=np.int64)
        train = np.setdiff1d(np.arange(len(profile)), test)
    else:  # trained on other data: every query of this profile is held out for it
        test, train = np.arange(len(profile)), profile_split(profile, test_fraction, seed)[0]
    return LadderFit(router, train, test, Path(router_path), trained_here=False)


def trained_ladder(
    profile: QualityProfile,
    models: list[str],
    cache_dir: Path | None,
    seed: int,
    test_fraction: float,
) -> tuple[Router, np.ndarray, np.ndarray, Path]:
    """Train the ladder router, or reuse the one trained before on the same profile, tiers and split.

    The router is the static-embedding one: it is what the plan ships to the gateway, which scores it in
    well under a millisecond per prompt (docs/quality.md). Training picks its regularisation by
    cross-validation (seconds)."""
    grouped = ["conversations"] if profile.records_conversations else []  # another split: not reused
    key = json.dumps([ROUTER_FORMAT, "static", profile.content_hash, list(models), seed, test_fraction, *grouped])
    path = Path(cache_dir or default_cache_dir()) / "routers" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
    if path.is_file():
        try:
            train, test = profile_split(profile, test_fraction, seed)
            return load_router(path, cache_dir), train, test, path
        except (SpecError, KeyError, ValueError, OSError):
            pass
    static = load_static(cache_dir=cache_dir)
    with building("router"):
        router, train, test = train_router(profile, models, seed=seed, test_fraction=test_fraction, static=static)
        router.save(path)
    return router, train, test, path


def trained_multi_router(
    profile: QualityProfile,
    models: list[str],
    train: np.ndarray,
    cache_dir: Path | None,
    seed: int,
    ladder: Router | None = None,
) -> tuple[MultiRouter, Path]:
    """Train the multi router on rows ``train``, or reuse the one trained before on the same profile content,
    tiers, rows and seed (kept beside the ladder routers, ``multi-<hash>.npz``). Training is a cross-validated
    level head, refitted on 5 folds, and N one-feature fits: seconds. ``ladder``: the ladder router trained on
    the same rows and seed; its level head is this very fit, taken with the static table it was fitted on (a
    re-distilled cache must not mix with it)."""
    rows = hashlib.sha256(np.asarray(train, dtype=np.int64).tobytes()).hexdigest()
    key = json.dumps([MULTI_FORMAT, "static", profile.content_hash, list(models), rows, seed])
    path = (
        Path(cache_dir or default_cache_dir())
        / "routers"
        / f"multi-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
    )
    if path.is_file():
        try:
            return load_multi_router(path), path
        except (SpecError, KeyError, ValueError, OSError):
            pass
    static, head = (
        (ladder.static, (ladder.head, float(ladder.metadata["C"])))
        if ladder is not None and ladder.static is not None
        else (load_static(cache_dir=cache_dir), None)
    )
    with building("router"):
        trained = train_multi_router(profile, models, train, static, seed=seed, level_head=head)
        path.parent.mkdir(parents=True, exist_ok=True)
        return trained.save(path), path
