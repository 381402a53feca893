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

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from boute.data.builds import building
from boute.errors import SpecError
from boute.quality.judges import DEFAULT_VERIFIER_EMBEDDER
from boute.quality.policy_quality import CascadeJudge, QualityModel
from boute.quality.profiles import QualityProfile, load_profile
from boute.quality.router import Router
from boute.quality.router_kinds import RouterFit, trained_kind
from boute.quality.shares import mix_weights
from boute.quality.trained import LadderFit, ladder_fit

if TYPE_CHECKING:
    from boute.quality.judges import OfflineVerifier
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

    Four steps: the ladder and its held-out split (:func:`~boute.quality.trained.ladder_fit`), the cascade's
    judge on the ladder's training rows (:func:`cascade_judging`), the scenario's pre-router trained beside
    the ladder (:meth:`~boute.quality.router_kinds.RouterKind.fit`: ``router_kind="multi"`` trains the multi
    router on the ladder's training rows, cached like it, so both share the held-out set and the calibration
    prompts; the plan ships it, ``info["router_path"]``), and the model over the held-out rows."""
    kind = trained_kind(router_kind)
    minilm = _minilm(profile, cache_dir)
    ladder = ladder_fit(profile, models, router_path, cache_dir, seed, test_fraction)
    judging = cascade_judging(profile, models, judge, ladder.train, cache_dir, seed, minilm)
    fit = kind.fit(profile, models, ladder, cache_dir, seed)
    cols = np.asarray([profile.models.index(m) for m in models], dtype=np.int64)
    return QualityModel(
        tiers=tuple(tier_names or models),
        test_scores=profile.scores[np.ix_(ladder.test, cols)],
        test_index=ladder.test,
        route_all=_ladder_scores(ladder.router, profile, minilm),
        cascade_scores=judging.scores if len(models) > 1 else None,
        info=_model_info(profile, models, router_kind, ladder, fit, judging),
        judge=judging.judge,
        prerouting=fit.prerouting,
    )


def _minilm(profile: QualityProfile, cache_dir: Path | None) -> Callable[[], np.ndarray]:
    """MiniLM embeddings of the prompts (disk-cached), computed on the first call: for a MiniLM router or
    verifier only; a static router or verifier embeds with its own table in milliseconds."""

    @functools.cache
    def embeddings() -> np.ndarray:
        from boute.quality.embed import Embedder

        return Embedder(cache_dir).embed(profile.prompts)

    return embeddings


def _ladder_scores(router: Router, profile: QualityProfile, minilm: Callable[[], np.ndarray]) -> np.ndarray:
    """The ladder's difficulty of every profile prompt (``route_all``): a static router embeds with its own
    table (milliseconds); a MiniLM one reuses the cached embeddings."""
    if router.static is not None:
        return router.score(profile.prompts)
    return router.score_embeddings(minilm(), profile.prompts)


@dataclass(frozen=True)
class CascadeJudging:
    """The judge a cascade's thresholds are cut on, its scores of every non-final tier's answer (computed on
    first use), and the verifier's file (None for an LLM judge)."""

    judge: CascadeJudge
    scores: Callable[[], np.ndarray]
    verifier_file: Path | None


def cascade_judging(
    profile: QualityProfile,
    models: list[str],
    judge: str,
    train: np.ndarray,
    cache_dir: Path | None,
    seed: int,
    minilm: Callable[[], np.ndarray],
) -> CascadeJudging:
    """``judge="llm"`` (with two tiers or more): the LLM judge the profile recorded, and its scores; else the
    offline verifier trained on rows ``train`` (lazily: a pre-route search never computes its scores)."""
    cascade_judge = recorded_llm_judge(profile, models) if judge == "llm" and len(models) > 1 else CascadeJudge()
    if cascade_judge.kind == "llm":
        return CascadeJudging(cascade_judge, lambda: llm_judge_scores(profile, models), None)
    path = verifier_path(profile, models, train, cache_dir, seed)

    @functools.cache
    def scores() -> np.ndarray:
        # once per quality model: the search's preparation computes them (boute.optimize.prepare), then every
        # model derived from it (another confidence level, a re-weighted mix) reads the same array
        out = verifier_scores(profile, models, train, cache_dir=cache_dir, seed=seed, path=path, minilm=minilm)
        out.setflags(write=False)
        return out

    return CascadeJudging(cascade_judge, scores, path)


def _model_info(
    profile: QualityProfile,
    models: list[str],
    router_kind: str,
    ladder: LadderFit,
    fit: RouterFit,
    judging: CascadeJudging,
) -> dict[str, Any]:
    """What a quality model records of how it was built (``QualityModel.info``)."""
    verifier = judging.verifier_file
    return {
        "profile": profile.source,
        "scale": list(profile.scale),
        "models": models,
        "n_queries": len(profile),
        "n_test": int(len(ladder.test)),
        "router": fit.description,
        "router_kind": router_kind,
        # what serving loads to reproduce the routing: the router file (its weights; metadata beside it), and
        # every file a plan bundles for it (weights first)
        "router_path": str(Path(fit.file).resolve()),
        "router_files": [str(f) for f in fit.files],
        "profile_hash": profile.content_hash,
        "router_test_auc": ladder.router.metadata.get("test_auc"),
        # what serving loads to judge a cascade as the optimiser did (written when cascade scores are first
        # computed, which every cascade evaluation does before a plan can be written)
        "verifier_path": str(verifier) if len(models) > 1 and verifier is not None else None,
        # the judge the cascade's thresholds are cut on (QualityModel.judge holds it typed)
        "judge": judging.judge.kind,
    }


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

    from boute.data import cache_dir as default_cache_dir
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
    from boute.quality.judges import load_verifier

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
        verifier = _trained_verifier(profile, judged, responses, train, cache_dir, seed, embedder, minilm)
        if path is not None:
            with building("verifier"):
                verifier.save(path)
    return np.stack([verifier.score(profile.prompts, responses[m]) for m in judged], axis=1)


def _trained_verifier(
    profile: QualityProfile,
    judged: list[str],
    responses: Mapping[str, Sequence[str]],
    train: np.ndarray,
    cache_dir: Path | None,
    seed: int,
    embedder: str,
    minilm: Callable[[], np.ndarray] | None,
) -> OfflineVerifier:
    """The cascade verifier trained on rows ``train`` of the judged tiers' recorded answers (:func:`verifier_scores`)."""
    from boute.quality.embed import Embedder
    from boute.quality.judges import RESPONSE_EMBED, response_tail, train_verifier
    from boute.quality.static_embed import load_static

    # Trained on the judged tiers' own answers only: that is the distribution it scores (and embedding
    # the largest tier's answers too would double the embedding work for little gain).
    static = load_static(cache_dir=cache_dir) if embedder == "static" else None
    with building("verifier"):
        if static is not None:
            pe = static.embed(profile.prompts)
            r_embs = {m: static.embed([response_tail(r) for r in responses[m]]) for m in judged}
        else:
            pe = minilm() if minilm is not None else Embedder(cache_dir).embed(profile.prompts)
            remb = Embedder(cache_dir, **RESPONSE_EMBED)
            r_embs = {m: remb.embed(responses[m]) for m in judged}
        labels = {m: profile.column(m) for m in judged}
        return train_verifier(profile.prompts, pe, responses, r_embs, labels, train, seed=seed, static=static)


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
