"""What a plan's ``routing.scorer`` asks of the rest of its routing: the plan validator's table, one row a scorer.

A scorer turns prompts into scores and scores into tiers, cut either by ``thresholds`` (tier k serves scores in
``(t[k-1], t[k]]``) or by per-tier ``prices`` (tier = argmax_k p_k(x) - lambda_k). Whether it needs a trained
file of the plan's bundle (``routing.router``) and which cut it reads are all the plan's validator must know.
How each scorer is loaded, run, trained and re-read is the quality layer's (:mod:`boute.quality.router_kinds`),
one class per row here, registered under the same name.

Each scorer has one name in the code. The ladder router's is ``ladder`` (as a scenario's
``quality.router_kind`` says), but plans have always spelled it ``learned``: :func:`scorer_name` reads both,
and plans are written with the old spelling (:func:`scorer_spelling`), so a gateway that predates the name
still reads a new plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: what turns a scorer's scores into tiers
CutKind = Literal["thresholds", "prices"]


@dataclass(frozen=True)
class ScorerRule:
    """One scorer as a plan names it."""

    name: str  # the name in the code (the quality layer's registry key)
    spelling: str  # how plans on disk name it (read and written)
    needs_router: bool  # a trained router file of the plan's bundle (``routing.router``)
    cut: CutKind  # what the plan's routing cuts its scores by


#: the scorers, in the order validation errors list them
SCORER_RULES: dict[str, ScorerRule] = {
    r.name: r
    for r in (
        ScorerRule("ladder", "learned", needs_router=True, cut="thresholds"),
        ScorerRule("length", "length", needs_router=False, cut="thresholds"),
        ScorerRule("multi", "multi", needs_router=True, cut="prices"),
    )
}

_BY_SPELLING = {r.spelling: r.name for r in SCORER_RULES.values()} | {r.name: r.name for r in SCORER_RULES.values()}


def scorer_name(value: object) -> str | None:
    """The code's name of a scorer a plan names (its spelling on disk or its code name); None when unknown."""
    return _BY_SPELLING.get(value) if isinstance(value, str) else None


def scorer_spelling(name: str) -> str:
    """How a plan file spells the scorer ``name``."""
    return SCORER_RULES[name].spelling


def spelled(names: list[str], last: str = "or") -> str:
    """``'a', 'b' or 'c'``: scorer names as plans spell them, for an error message."""
    quoted = [f"'{scorer_spelling(n)}'" for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} {last} {quoted[-1]}"
