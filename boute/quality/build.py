"""Build the :class:`QualityModel` a scenario needs: profile -> tier columns -> router -> (lazy) cascade judge.

The cascade's judge is the scenario's ``quality.judge``: the offline verifier (trained lazily on the
profile's recorded answers), or ``llm``, an LLM judge whose score of every answer the profile recorded
(``boute profile quality --cascade-judge``): its thresholds are then cut on those scores, by the same rule.

``quality_model_for(scenario)`` is called by the optimiser, the simulator and the CLI, often several times
per process, so results are memoised per process and embeddings are cached on disk (see
:mod:`boute.quality.embed`): the first call on a machine embeds the profile's prompts (minutes on two busy
CPU cores for GSM8K), later calls take well under a second.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from boute.errors import SpecError
from boute.quality.judges import DEFAULT_VERIFIER_EMBEDDER
from boute.quality.policy import CascadeJudge, QualityModel
from boute.quality.preroute import ROUTER_KINDS, MultiRouting, PreRouting
from boute.quality.profiles import QualityProfile, load_profile
from boute.quality.shares import mix_weights

if TYPE_CHECKING:
    from boute.quality.multi import MultiRouter
    from boute.specs.scenario import Scenario

_MEMO: dict[tuple[Any, ...], QualityModel] = {}


def profile_for(scenario: Scenario) -> QualityProfile:
    ref = scenario.quality.profile
    path: str | Path = ref if ref.startswith("builtin:") else scenario.resolve_path(ref)
    return load_profile(path, scenario.quality.format)


def tier_models(scenario: Scenario, profile: QualityProfile) -> list[str]:
    """Profile column of each scenario tier (``quality_model``, default the tier name), checked."""
    out = []
    for i, t in enumerate(scenario.tiers):
        m = t.quality_model or t.name
        if m not in profile.models:
            where = scenario.source or scenario.name
            raise SpecError(
                where,
                f"tiers[{i}].quality_model",
                f"'{m}' is not a model in {profile.source} (has: {', '.join(profile.models)})",
            )
        out.append(m)
    return out


def build_quality_model(
    profile: QualityProfile,
    models: list[str],
    tier_names: list[str] | None = None,
    *,
    router_path: Path | None = None,
    cache_dir: Path | None = None,
    seed: int = 0,
    test_fraction: float = 0.3,
    judge: str = "verifier",
    router_kind: str = "ladder",
) -> QualityModel:
    """Embed prompts (cached), train or load the router, and wire the cascade's judge: a lazily trained
    verifier, or (``judge="llm"``) the LLM judge's recorded scores (SpecError naming the profile and field
    when it has none).

    ``router_kind="multi"``: pre-route policies come from the multi router (:mod:`boute.quality.multi`),
    trained on the ladder's training rows (cached like it), so both routers share the held-out set and the
    calibration prompts; the plan ships the multi router (``info["router_path"]``)."""
    from boute.quality.embed import Embedder
    from boute.quality.router import load_router, split_indices

    minilm: list[np.ndarray] = []

    def emb() -> np.ndarray:
        """MiniLM embeddings of the prompts (disk-cached): for a MiniLM router or verifier only; a static
        router or verifier embeds with its own table in milliseconds."""
        if not minilm:
            minilm.append(Embedder(cache_dir).embed(profile.prompts))
        return minilm[0]

    if router_path is not None:
        router_file = Path(router_path)
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
            test, train = np.arange(len(profile)), split_indices(len(profile), test_fraction, seed)[0]
    else:
        router, train, test, router_file = _trained_router(profile, models, cache_dir, seed, test_fraction)
    cols = [profile.models.index(m) for m in models]

    cascade_judge = recorded_llm_judge(profile, models) if judge == "llm" and len(models) > 1 else CascadeJudge()
    llm = cascade_judge.kind == "llm"
    verifier_file = None if llm else verifier_path(profile, models, train, cache_dir, seed)

    def cascade_scores() -> np.ndarray:
        if verifier_file is None:  # an LLM judge's recorded scores
            return llm_judge_scores(profile, models)
        return verifier_scores(profile, models, train, cache_dir=cache_dir, seed=seed, path=verifier_file, minilm=emb)

    prerouting: PreRouting | None = None
    routed_by: Any = router
    if router_kind == "multi":
        # a router trained here is the multi router's level head already (same rows, seed, relative levels)
        ladder = router if router_path is None else None
        routed_by, router_file = _trained_multi_router(profile, models, train, cache_dir, seed, ladder)
        prerouting = MultiRouting(routed_by.predict(profile.prompts))
    elif router_kind != "ladder":
        raise SpecError(None, "quality.router_kind", f"must be one of {', '.join(ROUTER_KINDS)}, got {router_kind!r}")
    info = {
        "profile": profile.source,
        "scale": list(profile.scale),
        "models": models,
        "n_queries": len(profile),
        "n_test": int(len(test)),
        "router": routed_by.metadata.get("kind"),
        "router_kind": router_kind,
        # what serving loads to reproduce the routing: the router file (its weights; metadata beside it), and
        # every file a plan bundles for it (weights first)
        "router_path": str(Path(router_file).resolve()),
        "router_files": [str(f) for f in routed_by.files()],
        "profile_hash": profile.content_hash,
        "router_test_auc": router.metadata.get("test_auc"),
        # what serving loads to judge a cascade as the optimiser did (written when cascade scores are first
        # computed, which every cascade evaluation does before a plan can be written)
        "verifier_path": str(verifier_file) if len(models) > 1 and verifier_file is not None else None,
        # the judge the cascade's thresholds are cut on (QualityModel.judge holds it typed)
        "judge": cascade_judge.kind,
    }
    return QualityModel(
        tiers=tuple(tier_names or models),
        test_scores=profile.scores[np.ix_(test, np.asarray(cols, dtype=np.int64))],
        test_index=test,
        # a static router embeds with its own table (milliseconds); a MiniLM one reuses the cached embeddings
        route_all=router.score(profile.prompts)
        if router.static is not None
        else router.score_embeddings(emb(), profile.prompts),
        cascade_scores=cascade_scores if len(models) > 1 else None,
        info=info,
        judge=cascade_judge,
        prerouting=prerouting,
    )


def _trained_router(
    profile: QualityProfile,
    models: list[str],
    cache_dir: Path | None,
    seed: int,
    test_fraction: float,
) -> tuple[Any, np.ndarray, np.ndarray, Path]:
    """Train the router, or reuse the one trained before on the same profile, tiers and split.

    The router is the static-embedding one: it is what the plan ships to the gateway, which scores it in
    well under a millisecond per prompt (docs/quality.md). Training picks its regularisation by
    cross-validation (seconds) and depends on nothing but the profile's content, the tier models and the
    split, so it is cached beside the embeddings. A damaged entry is retrained.
    """
    import hashlib
    import json

    from boute.quality.embed import default_cache_dir
    from boute.quality.router import ROUTER_FORMAT, load_router, split_indices, train_router

    key = json.dumps([ROUTER_FORMAT, "static", profile.content_hash, list(models), seed, test_fraction])
    path = Path(cache_dir or default_cache_dir()) / "routers" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
    if path.is_file():
        try:
            train, test = split_indices(len(profile), test_fraction, seed)
            return load_router(path, cache_dir), train, test, path
        except (SpecError, KeyError, ValueError, OSError):
            pass
    from boute.quality.static_embed import load_static

    router, train, test = train_router(
        profile, models, seed=seed, test_fraction=test_fraction, static=load_static(cache_dir=cache_dir)
    )
    router.save(path)
    return router, train, test, path


def _trained_multi_router(
    profile: QualityProfile,
    models: list[str],
    train: np.ndarray,
    cache_dir: Path | None,
    seed: int,
    ladder: Any = None,
) -> tuple[MultiRouter, Path]:
    """Train the multi router on rows ``train``, or reuse the one trained before on the same profile content,
    tiers, rows and seed (kept beside the ladder routers, named by a hash of those; a damaged entry is
    retrained). Training is a cross-validated level head, refitted on 5 folds, and N one-feature fits: seconds.
    ``ladder``: the ladder router trained on the same rows and seed; its level head is this very fit, taken
    with the static table it was fitted on (a re-distilled cache must not mix with it)."""
    import hashlib
    import json

    from boute.quality.embed import default_cache_dir
    from boute.quality.multi import MULTI_FORMAT, load_multi_router, train_multi_router
    from boute.quality.static_embed import load_static

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
    if ladder is not None and ladder.static is not None:
        head = (ladder.head, float(ladder.metadata["C"]))
        trained = train_multi_router(profile, models, train, ladder.static, seed=seed, level_head=head)
    else:
        trained = train_multi_router(profile, models, train, load_static(cache_dir=cache_dir), seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    return trained.save(path), path


def verifier_path(
    profile: QualityProfile,
    models: list[str],
    train: np.ndarray,
    cache_dir: Path | None,
    seed: int,
    embedder: str = DEFAULT_VERIFIER_EMBEDDER,
) -> Path:
    """Where the cascade verifier for ``profile``'s ``models`` trained on rows ``train`` is kept.

    Training is a pure function of the profile's content, the judged tiers, the split, the seed and the
    embedder, so the file is named by a hash of them (beside the routers): a plan bundles the very file whose
    scores its thresholds were cut on, and a second build reuses it.
    """
    import hashlib
    import json

    from boute.quality.embed import default_cache_dir
    from boute.quality.judges import VERIFIER_FORMAT

    rows = hashlib.sha256(np.asarray(train, dtype=np.int64).tobytes()).hexdigest()
    key = json.dumps([VERIFIER_FORMAT, embedder, profile.content_hash, list(models[:-1]), rows, seed])
    return Path(cache_dir or default_cache_dir()) / "verifiers" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"


def verifier_scores(
    profile: QualityProfile,
    models: list[str],
    train: np.ndarray,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    path: Path | None = None,
    embedder: str = DEFAULT_VERIFIER_EMBEDDER,
    minilm: Callable[[], np.ndarray] | None = None,
) -> np.ndarray:
    """Offline verifier's confidence in each non-final tier's recorded answer, for every profile query.

    ``path``: where the verifier is kept (:func:`verifier_path`): loaded from there when a readable one is,
    else trained (on ``embedder``'s embeddings; ``minilm`` gives the prompts' cached MiniLM ones) and saved
    there. Scores come from the verifier's own :meth:`~boute.quality.judges.OfflineVerifier.score`, the
    function the gateway's judge calls."""
    from boute.errors import BouteError
    from boute.quality.embed import Embedder
    from boute.quality.judges import RESPONSE_EMBED, load_verifier, response_tail, train_verifier
    from boute.quality.static_embed import load_static

    judged = models[:-1]
    missing = [m for m in judged if m not in profile.responses]
    if missing:
        raise BouteError(f"{profile.source}: no recorded responses for '{missing[0]}': the cascade verifier needs them")
    responses = {m: profile.responses[m] for m in judged}
    verifier = None
    if path is not None and path.is_file():
        try:
            verifier = load_verifier(path, cache_dir)
        except (SpecError, KeyError, ValueError, OSError):
            verifier = None  # a damaged entry is retrained
    if verifier is None:
        # Trained on the judged tiers' own answers only: that is the distribution it scores (and embedding
        # the largest tier's answers too would double the embedding work for little gain).
        static = load_static(cache_dir=cache_dir) if embedder == "static" else None
        if static is not None:
            pe = static.embed(profile.prompts)
            r_embs = {m: static.embed([response_tail(r) for r in responses[m]]) for m in judged}
        else:
            pe = minilm() if minilm is not None else Embedder(cache_dir).embed(profile.prompts)
            remb = Embedder(cache_dir, **RESPONSE_EMBED)
            r_embs = {m: remb.embed(responses[m]) for m in judged}
        labels = {m: profile.column(m) for m in judged}
        verifier = train_verifier(profile.prompts, pe, responses, r_embs, labels, train, seed=seed, static=static)
        if path is not None:
            verifier.save(path)
    return np.stack([verifier.score(profile.prompts, responses[m]) for m in judged], axis=1)


def recorded_llm_judge(profile: QualityProfile, models: list[str]) -> CascadeJudge:
    """The LLM judge ``profile`` recorded, checked to have scored every judged tier (all but the last)."""
    llm_judge_scores(profile, models)
    rec = profile.judge
    assert rec is not None
    return CascadeJudge("llm", rec.model, rec.latency_s)


def llm_judge_scores(profile: QualityProfile, models: list[str]) -> np.ndarray:
    """The recorded LLM judge's score of each non-final tier's answer, (n, N-1): what a cascade judged by
    that LLM cuts its thresholds on (as :func:`verifier_scores` for the verifier)."""
    rec = profile.judge
    how = "record them with boute profile quality --cascade-judge NAME@MODEL=URL"
    if rec is None:
        raise SpecError(profile.source, "judge_scores", f"no LLM judge scores recorded (quality.judge: llm): {how}")
    missing = [m for m in models[:-1] if m not in rec.scores]
    if missing:
        raise SpecError(
            profile.source,
            "judge_scores",
            f"no LLM judge score of '{missing[0]}' (judged: {', '.join(rec.scores) or 'none'}): {how}",
        )
    return np.stack([rec.scores[m] for m in models[:-1]], axis=1)


def quality_model_for(scenario: Scenario, *, cache_dir: Path | None = None) -> QualityModel:
    """The scenario's quality model (memoised per process; embeddings cached on disk)."""
    profile_ref = scenario.quality.profile
    src = profile_ref if profile_ref.startswith("builtin:") else str(scenario.resolve_path(profile_ref))
    router_path = scenario.resolve_path(scenario.quality.router) if scenario.quality.router else None
    stamp = _mtime(src), _mtime(str(router_path)) if router_path else None
    key: tuple[Any, ...] = (
        src,
        scenario.quality.format,
        stamp,
        tuple((t.name, t.quality_model) for t in scenario.tiers),
        str(router_path),
        str(cache_dir),
        scenario.quality.judge,
        scenario.quality.router_kind,
    )
    if key not in _MEMO:
        profile = profile_for(scenario)
        models = tier_models(scenario, profile)
        _MEMO[key] = build_quality_model(
            profile,
            models,
            [t.name for t in scenario.tiers],
            router_path=router_path,
            cache_dir=cache_dir,
            judge=scenario.quality.judge,
            router_kind=scenario.quality.router_kind,
        )
    mix = scenario.workload.mix
    if mix is not None:
        mixed = (*key, tuple(mix.edges), tuple(mix.shares))
        if mixed not in _MEMO:
            base = _MEMO[key]
            try:
                weights = mix_weights(base.route_all, mix.edges, mix.shares)
            except ValueError as e:
                raise SpecError(scenario.source, "workload.mix", str(e)) from None
            _MEMO[mixed] = base.reweighted(weights)
        key = mixed
    t = scenario.targets
    if (t.quality_confidence, t.floor_on) == (_MEMO[key].confidence, _MEMO[key].hold):
        return _MEMO[key]
    held = (*key, t.quality_confidence, t.floor_on)
    if held not in _MEMO:  # the scenario's bound level, and what its floor holds on
        _MEMO[held] = _MEMO[key].with_confidence(t.quality_confidence, t.floor_on)
    return _MEMO[held]


def _mtime(path: str) -> float | None:
    if path.startswith("builtin:"):
        return None
    try:
        return Path(path).stat().st_mtime
    except OSError:
        return None
