"""The gateway's compiled routing: which tier a query goes to (pre-route) or in which order tiers are tried
(cascade).

A scorer maps prompts to a difficulty in [0, 1] (higher = needs a larger model). The plan names its scorer
(``routing.scorer``) and the prompts its cut was made on (``routing.reference``); the scorer's kind
(:mod:`boute.quality.router_kinds`, registered by that name) loads it from the plan's bundle and says how a
score becomes a tier: thresholds (the plan's, or cut from its fractions on the reference by the function the
optimiser uses, :func:`boute.quality.shares.thresholds_for_fractions`), or a multi-model router's argmax_k
p_k - lambda_k under the plan's prices. Nothing else is ever substituted: a plan whose scorer cannot be
loaded is refused. A cascade names its judge the same way (``routing.judge``, :func:`plan_judge`): the
verifier the optimiser scored it with, or an LLM judge, with the thresholds cut on that judge's scores; a
cascade that names none is refused.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from boute.errors import SpecError
from boute.quality.router_kinds import Scorer, router_kind
from boute.serving.reason import RouteReasons
from boute.specs.plan import Plan, Routing
from router.admission import MIN_GATEWAY_INFLIGHT, planned_inflight, tier_context
from router.errors import UnknownModel
from router.score_batch import ScoreBatcher


class Judge(Protocol):
    """Cascade judge: quality of ``response`` to ``prompt`` in [0, 1]; below the hop's threshold escalates."""

    async def ajudge(self, prompt: str, response: str) -> float: ...


#: why a cascade plan without its judge is refused: its thresholds mean nothing on another judge's scores
UNJUDGED = (
    "a cascade plan names its judge and the thresholds cut on that judge's scores (boute optimize --mode "
    "cascade writes both); this one names none, and no stand-in judge is served in its place"
)


def plan_judge(routing: Routing, root: Path, file: str | Path | None = None) -> Judge | None:
    """The judge a cascade plan names, loaded from its bundle (None for a pre-routed plan).

    ``verifier``: the plan's verifier file, warmed so the first request does not load the embedding model.
    ``llm`` needs an endpoint, which only the gateway knows (``BOUTE_JUDGE_URL``): it passes that judge in,
    so reaching here with one is a SpecError, as is a cascade that names no judge.
    """
    if routing.mode != "cascade":
        return None
    if routing.judge == "verifier":
        from boute.quality.judges import VerifierJudge, load_verifier

        assert routing.verifier is not None  # the plan's validator guarantees it
        try:
            judge = VerifierJudge(load_verifier(root / routing.verifier))
        except SpecError as exc:
            raise SpecError(file, "routing.verifier", str(exc)) from None
        judge.warm()
        return judge
    if routing.judge == "llm":
        raise SpecError(file, "routing.judge", "'llm' needs the judge endpoint: set BOUTE_JUDGE_URL on the gateway")
    raise SpecError(file, "routing.judge", UNJUDGED)


#: the model name sent to an LLM judge when neither the plan nor ``BOUTE_JUDGE_MODEL`` names one
DEFAULT_JUDGE_MODEL = "judge"


def endpoint_judge(
    routing: Routing, url: str | None, model: str | None, timeout_s: float, file: str | Path | None = None
) -> Judge | None:
    """The LLM judge at ``url`` (the gateway's ``BOUTE_JUDGE_URL``) for a cascade whose plan names an 'llm'
    judge; None for any other plan, whose judge (if any) comes from its bundle (:func:`plan_judge`).

    A plan whose thresholds were cut on a recorded LLM judge's scores names that judge's model
    (``routing.judge_model``); judging it with another model (``BOUTE_JUDGE_MODEL``) is a SpecError, since
    its thresholds mean nothing on that model's scores. Unset, the gateway asks for the plan's judge model."""
    if routing.mode != "cascade" or routing.judge != "llm" or not url:
        return None
    if model is None:
        model = routing.judge_model or DEFAULT_JUDGE_MODEL
    if routing.judge_model is not None and routing.judge_model != model:
        raise SpecError(
            file,
            "routing.judge_model",
            f"the thresholds were cut on judge '{routing.judge_model}'s scores; the gateway's judge is "
            f"'{model}' (set BOUTE_JUDGE_MODEL={routing.judge_model}, served at BOUTE_JUDGE_URL)",
        )
    from boute.quality.judges import LLMJudge

    return LLMJudge(url, model, timeout=timeout_s)


def load_scorer(routing: Routing, root: Path, file: str | Path | None = None) -> Scorer | None:
    """The plan's scorer, loaded by its kind (None when the plan names none: one loaded tier, or a cascade)."""
    return None if routing.scorer is None else router_kind(routing.scorer).load(routing, root, file)


class RoutePolicy:
    """A plan's routing, compiled: tiers, thresholds, mode, scorer. Immutable once built."""

    def __init__(
        self,
        plan: Plan,
        root: Path | None = None,
        scorer: Scorer | None = None,
        judge: Judge | None = None,
        file: str | Path | None = None,
    ) -> None:
        """``root``: the folder the plan's bundle paths resolve against; ``scorer`` replaces the plan's (tests)."""
        r = plan.routing
        root = root or Path.cwd()
        self.root = root  # where its bundle files are (the gateway uploads them from here for its peers)
        self.plan = plan
        self.mode = r.mode
        self.tiers: tuple[str, ...] = tuple(r.tiers)
        self.scorer: Scorer | None = scorer if scorer is not None else load_scorer(r, root, file)
        self._score_one = getattr(self.scorer, "score_one", None)
        self._batcher: ScoreBatcher | None = None
        #: where prompts are scored. ``inline``: on the event loop, one call per prompt (no scorer, the length
        #: CDF at ~1 µs, or another scorer that declares itself ``cheap``). ``batch``: on the event loop, the
        #: prompts of one loop turn in one ``score`` call (static-embedding routers: ~0.12-0.2 ms of CPU per prompt,
        #: mostly per-call overhead; under wrk batches held ~12 prompts and CPU per request fell from ~350 to
        #: ~250 µs against scoring inline, itself no dearer than a worker thread; see docs/router.md).
        #: ``thread``: a worker thread (MiniLM: milliseconds per prompt).
        self.scoring: str
        if self.scorer is None:
            self.scoring = "inline"
        elif getattr(self.scorer, "embedder_kind", None) == "static":
            self.scoring = "batch"
        elif getattr(self.scorer, "cheap", False):
            self.scoring = "inline"
        else:
            self.scoring = "thread"
        self.cheap = self.scoring != "thread"  # never queued behind a worker thread
        #: whether the score is a difficulty the re-plan loop's score-mix drift follows (a priced scorer's is a tier)
        self.difficulty = getattr(self.scorer, "difficulty", True)
        #: pre-route: a scorer that maps its score to a tier itself (a priced kind's, :class:`boute.quality.
        #: router_kinds.TierCut`); None: the tier is how many thresholds lie below the score
        self._tier_of: Callable[[float], int] | None = None
        self.thresholds: list[float] = self._cut(r, root, file)
        #: the fixed parts of each route's reason (the ``x-boute-reason`` header: :mod:`boute.serving.reason`)
        self.reasons = self._reasons()
        self.judge: Judge | None = judge if judge is not None else plan_judge(r, root, file)
        # model-name aliases that force a tier (RouteLLM style "router-<tier>", the bare tier, its model)
        self.forced: dict[str, int] = {}
        for i, t in enumerate(self.tiers):
            self.forced[f"router-{t}"] = i
            self.forced[t] = i
        for g in plan.deployment:
            self.forced.setdefault(g.model, self.tiers.index(g.tier))
        self.auto_names = frozenset({"boute", "auto", "router", "router-auto", "router-boute"})
        #: per tier, the context length (tokens) of its model, the least when its groups serve several (a
        #: request may go to any); requests that cannot fit are refused before they take a slot
        self.context = tier_context(plan, file)
        #: per tier, requests in flight per healthy replica before shedding (:func:`router.admission.planned_inflight`)
        self.inflight_per_replica = planned_inflight(plan)
        #: the gateway-wide bound the plan implies: every replica's tier bound, summed
        planned = sum(self.inflight_per_replica[g.tier] * g.count for g in plan.deployment)
        self.inflight_total = max(MIN_GATEWAY_INFLIGHT, planned)

    def _cut(self, r: Routing, root: Path, file: str | Path | None) -> list[float]:
        """Pre-route: the scorer kind's cut (:meth:`boute.quality.router_kinds.RouterKind.tier_cut`), or, with no
        scorer, everything to the one loaded tier. Cascade: the judge's thresholds (a SpecError without them)."""
        if self.mode == "preroute" and self.scorer is not None and r.scorer is not None:
            cut = router_kind(r.scorer).tier_cut(r, self.scorer, root)
            self._tier_of = cut.tier_of
            return list(cut.thresholds)
        if r.thresholds is not None:
            return [float(t) for t in r.thresholds]
        if self.mode == "preroute":  # no split: everything to the one loaded tier
            fr = list(r.fractions or [])
            only = next(i for i, f in enumerate(fr) if f > 0)
            return [-np.inf] * only + [np.inf] * (len(self.tiers) - 1 - only)
        raise SpecError(file, "routing.judge", UNJUDGED)

    def _reasons(self) -> RouteReasons:
        """What a route's reason names: a cascade's hop thresholds; a pre-route's thresholds or (a priced scorer,
        which maps scores itself) its prices; nothing to compare where one tier is loaded (no scorer)."""
        if self.mode == "cascade":
            return RouteReasons.cascade(self.tiers, self.thresholds)
        if self.scorer is None or len(self.tiers) == 1:
            return RouteReasons.one_tier(self.tiers)
        if self._tier_of is not None:  # a priced scorer (boute.quality.router_kinds.PricedScorer)
            prices = getattr(self.scorer, "prices", ())
            return RouteReasons.by_prices(self.tiers, [float(p) for p in prices], bool(self.difficulty))
        return RouteReasons.by_thresholds(self.tiers, self.thresholds)

    def model_names(self) -> list[str]:
        return ["boute", *(f"router-{t}" for t in self.tiers)]

    def resolve_model(self, name: str | None) -> int | None:
        """Tier index if ``name`` forces one, None for automatic routing; :class:`router.errors.UnknownModel`
        if it is neither."""
        if name is None or name in self.auto_names:
            return None
        tier = self.forced.get(name)
        if tier is None:
            raise UnknownModel(name, self.model_names())
        return tier

    async def score_batched(self, prompt: str) -> float:
        """Score with the prompts that arrive in the same event-loop turn, in one ``score`` call."""
        b = self._batcher
        if b is None:
            b = self._batcher = ScoreBatcher(self.scorer)
        return await b.submit(prompt)

    def score_sync(self, prompt: str) -> float:
        if self._score_one is not None:
            return float(self._score_one(prompt))
        if self.scorer is None:
            return 0.0
        return float(self.scorer.score([prompt])[0])

    def tier_for_score(self, score: float) -> int:
        """Pre-route: the number of thresholds below the score (tier k serves ``t[k-1] < d <= t[k]``, the rule
        of :class:`boute.quality.policy_quality.QualityModel`); a priced scorer's own map."""
        if self._tier_of is not None:
            return self._tier_of(score)
        return bisect.bisect_left(self.thresholds, score)

    def accepts(self, hop: int, judge_score: float) -> bool:
        """Cascade: keep tier ``hop``'s answer when the judge score reaches that hop's threshold."""
        return hop >= len(self.thresholds) or judge_score >= self.thresholds[hop]
