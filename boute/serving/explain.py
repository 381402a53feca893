"""``boute verify --explain``: the replayed answers' route reasons (``x-boute-reason``), summarised by tier.

Per tier that answered: how many requests, how the tier was chosen (by threshold, by prices, one tier loaded,
forced by the request's model, a cascade), the router's scores that sent requests there (min and max) and the
thresholds or prices they were compared with. For a cascade, per hop: how many answers the judge saw there,
its verdicts (accepted, escalated, judge failed, passed on unjudged) and the judge's scores (10th, 50th and
90th percentiles), with the hop's threshold. A reason that contradicts itself or the tier that answered
(:meth:`boute.serving.reason.Reason.consistent`) is counted: it would mean the gateway routed against its plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from boute.serving.reason import Reason, parse_reason
from boute.stats import quantile


@dataclass(frozen=True)
class TierReasons:
    """Why requests reached one tier."""

    tier: str
    requests: int
    #: how the tier was chosen -> requests: "threshold", "prices", "one-tier" (pre-route), "forced", "cascade"
    how: dict[str, int]
    score_min: float | None = None  # pre-route: the router's scores of the requests sent here
    score_max: float | None = None
    above: list[float] = field(default_factory=list)  # the thresholds the scores were compared with (distinct)
    upto: list[float] = field(default_factory=list)
    prices: list[float] | None = None


@dataclass(frozen=True)
class HopReasons:
    """A cascade hop: what the judge made of the answers of its tier."""

    tier: str
    reached: int
    verdicts: dict[str, int]  # accepted, escalated, judge-failed, final, unjudged -> answers
    threshold: float | None = None
    judge_p10: float | None = None
    judge_p50: float | None = None
    judge_p90: float | None = None


@dataclass(frozen=True)
class Explanation:
    """The reasons of the answered requests: ``explained`` carried one, ``unexplained`` did not (a gateway that
    predates the header) or carried one that does not read; ``inconsistent`` contradicts itself or the tier."""

    explained: int
    unexplained: int
    inconsistent: int
    tiers: list[TierReasons]
    hops: list[HopReasons]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tier(name: str, reasons: list[Reason]) -> TierReasons:
    how: dict[str, int] = {}
    for r in reasons:
        key = r.by if r.how == "preroute" and r.by else r.how
        how[key] = how.get(key, 0) + 1
    scores = [r.score for r in reasons if r.how == "preroute" and r.score is not None]
    prices = next((list(r.prices) for r in reasons if r.prices is not None), None)
    return TierReasons(
        name,
        len(reasons),
        how,
        min(scores) if scores else None,
        max(scores) if scores else None,
        sorted({r.above for r in reasons if r.above is not None}),
        sorted({r.upto for r in reasons if r.upto is not None}),
        prices,
    )


def _hops(order: Sequence[str], reasons: list[Reason]) -> list[HopReasons]:
    seen: dict[str, list[tuple[str, float | None, float | None]]] = {}
    for r in reasons:
        for h in r.hops:
            seen.setdefault(h.tier, []).append((h.verdict, h.score, h.threshold))
    out = []
    for tier in sorted(seen, key=lambda t: order.index(t) if t in order else len(order)):
        got = seen[tier]
        verdicts: dict[str, int] = {}
        for v, _, _ in got:
            verdicts[v] = verdicts.get(v, 0) + 1
        judged = [s for _, s, _ in got if s is not None]
        threshold = next((t for _, _, t in got if t is not None), None)
        q = [quantile(judged, p) if judged else None for p in (0.1, 0.5, 0.9)]
        out.append(HopReasons(tier, len(got), verdicts, threshold, q[0], q[1], q[2]))
    return out


def explain_routes(order: Sequence[str], answered: Sequence[str | None], reasons: Sequence[str | None]) -> Explanation:
    """Summarise the reasons of the answers (``answered``: each answer's ``x-boute-tier``, None for a request
    that got no answer; ``reasons``: its ``x-boute-reason``), tiers in the plan's ``order``."""
    read: list[Reason] = []
    unexplained = inconsistent = 0
    for tier, text in zip(answered, reasons, strict=True):
        if tier is None:
            continue
        try:
            r = parse_reason(text) if text else None
        except ValueError:
            r = None
        if r is None:
            unexplained += 1
            continue
        read.append(r)
        inconsistent += r.tier != tier or not r.consistent()
    by_tier: dict[str, list[Reason]] = {}
    for r in read:
        by_tier.setdefault(r.tier, []).append(r)
    names = sorted(by_tier, key=lambda t: order.index(t) if t in order else len(order))
    tiers = [_tier(t, by_tier[t]) for t in names]
    return Explanation(len(read), unexplained, inconsistent, tiers, _hops(order, read))
