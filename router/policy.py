"""Routing decisions: which tier a query goes to (pre-route) or in which order tiers are tried (cascade).

A :class:`Scorer` maps prompts to a difficulty in [0, 1] (higher = needs a larger model). The plan gives
either ``thresholds`` on that score or load ``fractions``; fractions are turned into thresholds once per
plan by scoring a reference sample of prompts (the quality profile's) and taking quantiles, so live
traffic with the reference's difficulty mix is split as the optimiser planned.

Scorers: :class:`LengthScorer` (empirical CDF of prompt length over the reference; cheap, used until a
learned router exists) and the quality side's learned router (``plan.routing.router``), loaded through
``boute.quality.load_router`` when that module is installed.
"""

from __future__ import annotations

import bisect
import csv
import logging
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

import numpy as np

from boute.specs.plan import Plan

log = logging.getLogger("boute.router.policy")

REFERENCE_PROFILE = "builtin:gsm8k"
REFERENCE_SAMPLE = 256


@runtime_checkable
class Scorer(Protocol):
    """Difficulty of prompts in [0, 1]; higher means a larger model is needed."""

    def score(self, prompts: list[str]) -> np.ndarray: ...


class Judge(Protocol):
    """Cascade judge: quality of ``response`` to ``prompt`` in [0, 1]; below the hop's threshold escalates."""

    async def ajudge(self, prompt: str, response: str) -> float: ...


class LengthScorer:
    """Difficulty = share of reference prompts shorter than this one (longer prompts -> larger tier).

    A deliberately simple stand-in for the learned router: O(log n) per prompt, no model.
    """

    cheap = True

    def __init__(self, reference: Sequence[str]) -> None:
        self._lengths = sorted(len(p) for p in reference) or [0]

    def score_one(self, prompt: str) -> float:
        return bisect.bisect_left(self._lengths, len(prompt)) / len(self._lengths)

    def score(self, prompts: list[str]) -> np.ndarray:
        return np.array([self.score_one(p) for p in prompts], dtype=float)


class ScorerJudge:
    """Cascade stand-in when no verifier/LLM judge is configured: accepts easy prompts (1 - difficulty).

    It ignores the response, so it is only a placeholder that exercises the cascade mechanics.
    """

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer

    async def ajudge(self, prompt: str, response: str) -> float:
        return 1.0 - float(self.scorer.score([prompt])[0])


@lru_cache(maxsize=4)
def reference_prompts(profile: str = REFERENCE_PROFILE, n: int = REFERENCE_SAMPLE) -> tuple[str, ...]:
    """An evenly spaced sample of a profile's prompts (deterministic, so every instance agrees)."""
    from boute.data import data_path

    path = data_path(profile)
    with open(path, newline="", encoding="utf-8") as fh:
        prompts = [row["prompt"] for row in csv.DictReader(fh) if row.get("prompt")]
    if len(prompts) <= n:
        return tuple(prompts)
    idx = np.linspace(0, len(prompts) - 1, n).astype(int)
    return tuple(prompts[i] for i in idx)


def load_scorer(router_file: str | None) -> Scorer:
    """The plan's learned router if given and the quality package is there, else the length scorer."""
    if router_file:
        try:
            from boute.quality import load_router  # type: ignore[attr-defined]
        except ImportError:
            log.warning("plan names router %s but boute.quality is not available: using prompt length", router_file)
        else:
            return load_router(router_file)
    return LengthScorer(reference_prompts())


def thresholds_from_fractions(scores: np.ndarray, fractions: Sequence[float]) -> list[float]:
    """Score cut points so that ``fractions[i]`` of the reference lands in tier i (pre-route)."""
    cum = np.cumsum(np.asarray(fractions, dtype=float))[:-1]
    return [float(x) for x in np.quantile(scores, np.clip(cum, 0.0, 1.0))]


def cascade_thresholds(judge_scores: np.ndarray, fractions: Sequence[float]) -> list[float]:
    """Judge cut points so that ``fractions[i]`` of queries are accepted at tier i.

    Approximation: the judge's score distribution is taken as the same at every hop, so tier i accepts
    ``f_i / (1 - f_0 - ... - f_{i-1})`` of what reaches it.
    """
    out: list[float] = []
    remaining = 1.0
    for f in list(fractions)[:-1]:
        accept = f / remaining if remaining > 1e-12 else 1.0
        out.append(float(np.quantile(judge_scores, float(np.clip(1.0 - accept, 0.0, 1.0)))))
        remaining -= f
    return out


class RoutePolicy:
    """A plan's routing, compiled: tiers, thresholds, mode, scorer. Immutable once built."""

    def __init__(self, plan: Plan, scorer: Scorer | None = None, judge: Judge | None = None) -> None:
        r = plan.routing
        self.plan = plan
        self.mode = r.mode
        self.tiers: tuple[str, ...] = tuple(r.tiers)
        self.scorer: Scorer = scorer if scorer is not None else load_scorer(r.router)
        self._score_one = getattr(self.scorer, "score_one", None)
        self.cheap = bool(getattr(self.scorer, "cheap", False))
        self.judge: Judge = judge if judge is not None else ScorerJudge(self.scorer)
        ref = list(reference_prompts())
        if r.thresholds is not None:
            self.thresholds = [float(t) for t in r.thresholds]
        elif self.mode == "preroute":
            self.thresholds = thresholds_from_fractions(self.scorer.score(ref), r.fractions or [])
        else:
            self.thresholds = cascade_thresholds(1.0 - self.scorer.score(ref), r.fractions or [])
        # model-name aliases that force a tier (RouteLLM style "router-<tier>", the bare tier, its model)
        self.forced: dict[str, int] = {}
        for i, t in enumerate(self.tiers):
            self.forced[f"router-{t}"] = i
            self.forced[t] = i
        for g in plan.deployment:
            self.forced.setdefault(g.model, self.tiers.index(g.tier))
        self.auto_names = frozenset({"boute", "auto", "router", "router-auto", "router-boute"})

    def model_names(self) -> list[str]:
        return ["boute", *(f"router-{t}" for t in self.tiers)]

    def resolve_model(self, name: Any) -> int | None | bool:
        """Tier index if ``name`` forces one, None for automatic routing, False if unknown."""
        if name is None or name in self.auto_names:
            return None
        if isinstance(name, str) and name in self.forced:
            return self.forced[name]
        return False

    def score_sync(self, prompt: str) -> float:
        if self._score_one is not None:
            return float(self._score_one(prompt))
        return float(self.scorer.score([prompt])[0])

    def tier_for_score(self, score: float) -> int:
        """Pre-route: the number of thresholds at or below the score."""
        return bisect.bisect_right(self.thresholds, score)

    def accepts(self, hop: int, judge_score: float) -> bool:
        """Cascade: keep tier ``hop``'s answer when the judge score reaches that hop's threshold."""
        return hop >= len(self.thresholds) or judge_score >= self.thresholds[hop]
