"""The pre-router kinds, one class each, registered by the plan's scorer name: what every caller asks of a kind.

One table of router classes by name, as RouteLLM keeps its ``ROUTER_CLS``. A :class:`RouterKind` says, for
one kind of pre-router:

- the gateway: how it is loaded from a plan (:meth:`~RouterKind.load`: a :class:`Scorer`, its files checked)
  and how a score becomes a tier (:meth:`~RouterKind.tier_cut`: the plan's thresholds, or thresholds cut from
  its fractions on the reference prompts; a priced kind maps scores itself, argmax_k p_k - lambda_k);
- the optimiser: how it is trained on a profile beside the ladder (:meth:`~RouterKind.fit`, the ``trained``
  kinds a scenario's ``quality.router_kind`` may name) and which files a plan bundles for it
  (:meth:`~RouterKind.files`); whether the file a scenario's ``quality.router`` names is one of its own
  (``scenario_router``);
- the re-plan loop: the difficulty scores the gateway records for the plan's reference prompts
  (:meth:`~RouterKind.difficulty_scores`), and the load shares the plan's cut gives under a quality model
  (:meth:`~RouterKind.running_fractions`: the inverse of the optimiser's fractions -> cut).

What a plan's validator asks of a scorer (a router file? thresholds or prices?) is the row of the same name in
:data:`boute.specs.scorers.SCORER_RULES`, in the layer below. A new kind is one class here, registered with
:func:`register`, and its row there.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np

from boute.errors import SpecError
from boute.quality.multi import MultiRouter, irt_correctness, load_multi_router, prices_for_shares, route
from boute.quality.policy_quality import QualityModel
from boute.quality.preroute import MultiRouting, PreRouting
from boute.quality.profiles import QualityProfile, load_profile
from boute.quality.router import load_router, router_files
from boute.quality.shares import thresholds_for_fractions
from boute.quality.trained import LadderFit, trained_multi_router
from boute.specs.plan import Routing
from boute.specs.scorers import SCORER_RULES, ScorerRule

T = TypeVar("T")


@runtime_checkable
class Scorer(Protocol):
    """Difficulty of prompts in [0, 1]; higher means a larger model is needed."""

    def score(self, prompts: list[str]) -> np.ndarray: ...


class LengthScorer:
    """Difficulty = share of reference prompts shorter than this one (longer prompts -> larger tier).

    A deliberately simple scorer, chosen explicitly in a plan (``routing.scorer: length``): O(log n) per
    prompt, no model.
    """

    cheap = True

    def __init__(self, reference: Sequence[str]) -> None:
        self._lengths = sorted(len(p) for p in reference) or [0]

    def score_one(self, prompt: str) -> float:
        return bisect.bisect_left(self._lengths, len(prompt)) / len(self._lengths)

    def score(self, prompts: list[str]) -> np.ndarray:
        return np.array([self.score_one(p) for p in prompts], dtype=float)


class PricedScorer:
    """A multi-model router under fixed prices: the tier of a prompt is argmax_k p_k(x) - lambda_k
    (:func:`boute.quality.multi.route`).

    An item-response router (format /2: ``p_k = sigmoid(a_k + b_k d(x))``) scores a prompt by its difficulty
    ``d(x)``, as the ladder's router does (the same level head on the same rows: the re-plan loop's score-mix
    drift follows it), and :meth:`tier_of` maps that score to the tier. A router of independent heads
    (format /1) has no difficulty: its "score" is the tier itself, as a float, and :attr:`difficulty` is
    False, so the gateway does not record it for the re-plan loop. Both are batched per event-loop turn by
    the gateway's score batcher."""

    embedder_kind = "static"

    def __init__(self, router: MultiRouter, prices: Sequence[float]) -> None:
        self.router = router
        self.prices = np.asarray(prices, dtype=np.float64)
        self.calib: np.ndarray | None = router.calib
        self.difficulty = self.calib is not None

    def score(self, prompts: list[str]) -> np.ndarray:
        if self.difficulty:
            return np.asarray(self.router.score(prompts), dtype=np.float64)
        return route(self.router.predict(prompts), self.prices).astype(np.float64)

    def score_one(self, prompt: str) -> float:
        return float(self.score([prompt])[0])

    def tier_of(self, score: float) -> int:
        """The tier for a score: argmax_k sigmoid(a_k + b_k d) - lambda_k at d = ``score`` (the functions the
        optimiser routed the held-out prompts with), or the score itself for a format /1 router."""
        if self.calib is None:
            return int(score)
        return int(route(irt_correctness(np.array([score]), self.calib), self.prices)[0])


@dataclass(frozen=True)
class TierCut:
    """How the gateway turns a pre-routed plan's scores into tiers: tier = how many ``thresholds`` lie below
    the score (tier k serves ``t[k-1] < d <= t[k]``), or, when ``tier_of`` is set, the scorer's own map (a
    priced kind's argmax; ``thresholds`` then empty)."""

    thresholds: tuple[float, ...] = ()
    tier_of: Callable[[float], int] | None = None


@dataclass(frozen=True)
class RouterFit:
    """A kind trained for a quality model: how it pre-routes the profile's rows (None: the ladder's
    ``route_all`` itself), what the trained router is, and the file a plan names, with every file it bundles
    (weights first)."""

    prerouting: PreRouting | None
    description: str | None  # what the router is, in its own words (its metadata's ``kind``)
    file: Path
    files: list[Path]


def _resolve(ref: str, root: Path) -> str | Path:
    return ref if ref.startswith("builtin:") else root / ref


@lru_cache(maxsize=4)
def reference_prompts(reference: str, root: Path) -> tuple[str, ...]:
    """All prompts of the reference profile, in profile order (what thresholds and prices are cut on)."""
    return tuple(load_profile(_resolve(reference, root)).prompts)


class RouterKind(ABC):
    """One kind of pre-router, by the plan's scorer name (module doc). The defaults are a scorer cut by
    thresholds, trained by nothing, whose scores the re-plan loop does not read."""

    name: ClassVar[str]
    #: the optimiser trains it on a profile (a scenario's ``quality.router_kind`` may name it)
    trained: ClassVar[bool] = False
    #: the file a scenario's ``quality.router`` names is this kind's (a plan routed by it carries its bundled
    #: file there too)
    scenario_router: ClassVar[bool] = False

    @property
    def rule(self) -> ScorerRule:
        """What a plan routed by this kind must hold (:data:`~boute.specs.scorers.SCORER_RULES`)."""
        return SCORER_RULES[self.name]

    # ------------------------------------------------------------------------------------------ gateway
    @abstractmethod
    def load(self, routing: Routing, root: Path, file: str | Path | None = None) -> Scorer:
        """The plan's scorer, its files resolved against ``root`` and checked (SpecError naming the field)."""

    def tier_cut(self, routing: Routing, scorer: Scorer, root: Path) -> TierCut:
        """The plan's thresholds, or (a plan with only fractions) the optimiser's rule applied to the reference
        prompts' scores: :func:`boute.quality.shares.thresholds_for_fractions`."""
        if routing.thresholds is not None:
            return TierCut(tuple(float(t) for t in routing.thresholds))
        assert routing.reference is not None  # the plan's validator guarantees it
        ref = list(reference_prompts(routing.reference, root))
        cut = thresholds_for_fractions(scorer.score(ref), list(routing.fractions or []))
        return TierCut(tuple(float(t) for t in cut))

    # ---------------------------------------------------------------------------------------- optimiser
    def fit(
        self, profile: QualityProfile, models: list[str], ladder: LadderFit, cache_dir: Path | None, seed: int
    ) -> RouterFit:
        """This kind trained on ``ladder``'s training rows (kinds with ``trained`` only)."""
        raise _untrained(self.name)

    def files(self, path: str | Path) -> list[Path]:
        """Every file of this kind's router at ``path`` (weights first): what a plan bundles."""
        return []

    # ------------------------------------------------------------------------------------------- replan
    def difficulty_scores(self, routing: Routing, root: Path, prompts: list[str]) -> np.ndarray:
        """The plan's router's difficulty of ``prompts``, as the gateway records it for the re-plan loop's
        score mix; empty when this kind's score is no difficulty on the profile's router scale."""
        return np.zeros(0)

    def running_fractions(
        self, routing: Routing, pre_routed_by: str, model: Callable[[], QualityModel]
    ) -> np.ndarray | None:
        """The load shares the plan's cut gives under ``model()`` (a quality model pre-routed by the kind
        ``pre_routed_by``, built only when it can read the cut); None when it cannot."""
        return None


#: the kinds, by the plan's scorer name
ROUTER_KINDS: dict[str, RouterKind] = {}


def register(cls: type[RouterKind]) -> type[RouterKind]:
    """Add a kind to :data:`ROUTER_KINDS` under its name (which must be a row of the plan's scorer table)."""
    if cls.name not in SCORER_RULES:
        raise ValueError(f"router kind {cls.name!r} has no row in boute.specs.scorers.SCORER_RULES")
    ROUTER_KINDS[cls.name] = cls()
    return cls


def router_kind(name: str) -> RouterKind:
    """The kind a plan's ``routing.scorer`` names (every name the plan's validator accepts has one)."""
    return ROUTER_KINDS[name]


def trained_kind(name: str) -> RouterKind:
    """The kind a scenario's ``quality.router_kind`` names (SpecError unless the optimiser trains it)."""
    kind = ROUTER_KINDS.get(name)
    if kind is None or not kind.trained:
        raise _untrained(name)
    return kind


def _untrained(name: str) -> SpecError:
    return SpecError(None, "quality.router_kind", f"must be one of {', '.join(TRAINED_KINDS)}, got {name!r}")


def _checked(file: str | Path | None, load: Callable[[], T]) -> T:
    """``load()``, a SpecError about the router's own file restated as one about the plan's ``routing.router``."""
    try:
        return load()
    except SpecError as exc:
        raise SpecError(file, "routing.router", str(exc)) from None


@register
class LadderKind(RouterKind):
    """The ladder: one difficulty score (:mod:`boute.quality.router`), cut by thresholds; what every quality
    model holds (``route_all``), so its thresholds read under any of them."""

    name = "ladder"
    trained = True
    scenario_router = True

    def load(self, routing: Routing, root: Path, file: str | Path | None = None) -> Scorer:
        assert routing.router is not None  # the plan's validator guarantees it
        router = routing.router
        return _checked(file, lambda: load_router(root / router))

    def fit(
        self, profile: QualityProfile, models: list[str], ladder: LadderFit, cache_dir: Path | None, seed: int
    ) -> RouterFit:
        """The ladder itself: pre-route policies cut ``route_all`` (``prerouting`` None)."""
        return RouterFit(None, ladder.router.metadata.get("kind"), ladder.file, ladder.router.files())

    def files(self, path: str | Path) -> list[Path]:
        return router_files(path)

    def difficulty_scores(self, routing: Routing, root: Path, prompts: list[str]) -> np.ndarray:
        if not routing.router:
            return np.zeros(0)
        return np.asarray(load_router(root / routing.router).score(prompts))

    def running_fractions(
        self, routing: Routing, pre_routed_by: str, model: Callable[[], QualityModel]
    ) -> np.ndarray | None:
        if routing.thresholds is None:
            return None
        return model().fractions_for_thresholds(routing.thresholds)


@register
class MultiKind(RouterKind):
    """The multi router (:mod:`boute.quality.multi`): each tier's predicted correctness p_k, routed to
    argmax_k p_k - lambda_k under per-tier prices; trained on the ladder's rows, read only by a quality model
    that pre-routes with it."""

    name = "multi"
    trained = True

    def load(self, routing: Routing, root: Path, file: str | Path | None = None) -> Scorer:
        """The plan's multi router under its prices (:meth:`prices`), checked to route the plan's tiers."""
        assert routing.router is not None  # the plan's validator guarantees it
        path = root / routing.router
        multi = _checked(file, lambda: load_multi_router(path))
        if list(multi.tiers) and len(multi.tiers) != len(routing.tiers):
            raise SpecError(
                file, "routing.router", f"the multi router has {len(multi.tiers)} tiers, the plan {len(routing.tiers)}"
            )
        return PricedScorer(multi, self.prices(routing, multi, root))

    @staticmethod
    def prices(routing: Routing, router: MultiRouter, root: Path) -> list[float]:
        """The plan's prices, or (a plan that has only fractions) the optimiser's rule applied to its reference
        prompts: :func:`boute.quality.multi.prices_for_shares` on the router's predictions for them."""
        if routing.prices is not None:
            return [float(v) for v in routing.prices]
        assert routing.reference is not None and routing.fractions is not None  # the plan's validator
        ref = list(reference_prompts(routing.reference, root))
        return [float(v) for v in prices_for_shares(router.predict(ref), routing.fractions)]

    def tier_cut(self, routing: Routing, scorer: Scorer, root: Path) -> TierCut:
        """The priced scorer maps its own scores (:meth:`PricedScorer.tier_of`); no thresholds."""
        if not isinstance(scorer, PricedScorer):  # a stand-in scorer (tests): thresholds on its scores
            return super().tier_cut(routing, scorer, root)
        return TierCut((), scorer.tier_of)

    def fit(
        self, profile: QualityProfile, models: list[str], ladder: LadderFit, cache_dir: Path | None, seed: int
    ) -> RouterFit:
        """Trained on the ladder's training rows (cached like it), so both share the held-out set and the
        calibration prompts; a ladder trained here is its level head already (same rows, seed, relative
        levels)."""
        level = ladder.router if ladder.trained_here else None
        multi, path = trained_multi_router(profile, models, ladder.train, cache_dir, seed, level)
        return RouterFit(MultiRouting(multi.predict(profile.prompts)), multi.metadata.get("kind"), path, multi.files())

    def files(self, path: str | Path) -> list[Path]:
        return load_multi_router(path).files()

    def difficulty_scores(self, routing: Routing, root: Path, prompts: list[str]) -> np.ndarray:
        """An item-response router's difficulty (format /2; a format /1 router records none)."""
        if not routing.router:
            return np.zeros(0)
        multi = load_multi_router(root / routing.router)
        return np.asarray(multi.score(prompts)) if multi.calib is not None else np.zeros(0)

    def running_fractions(
        self, routing: Routing, pre_routed_by: str, model: Callable[[], QualityModel]
    ) -> np.ndarray | None:
        if routing.prices is None or pre_routed_by != self.name:
            return None
        return model().fractions_for_prices(routing.prices)


@register
class LengthKind(RouterKind):
    """The prompt-length CDF over the reference: no model, no file, nothing the optimiser trains."""

    name = "length"

    def load(self, routing: Routing, root: Path, file: str | Path | None = None) -> Scorer:
        assert routing.reference is not None  # the plan's validator guarantees it
        return LengthScorer(reference_prompts(routing.reference, root))


#: the kinds the optimiser trains, in registry order (what a scenario's ``quality.router_kind`` may name)
TRAINED_KINDS: tuple[str, ...] = tuple(name for name, kind in ROUTER_KINDS.items() if kind.trained)

if set(ROUTER_KINDS) != set(SCORER_RULES):  # each plan scorer has its kind, and no kind lacks its row
    raise RuntimeError(f"router kinds {sorted(ROUTER_KINDS)} and plan scorers {sorted(SCORER_RULES)} differ")
