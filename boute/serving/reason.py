"""Why a request went where it went: the ``x-boute-reason`` header the gateway writes on every routed answer
(and its access log repeats), and the reader ``boute verify --explain`` summarises.

One line of ``"; "``-separated fields; the first says how the tier was chosen, ``tier`` which one::

    preroute; tier=large; by=threshold; score=0.6132; above=0.4821
    preroute; tier=small; by=threshold; score=0.2210; upto=0.4821
    preroute; tier=mid; by=threshold; score=0.5000; above=0.3000; upto=0.7000
    preroute; tier=large; by=prices; score=0.6132; prices=0.0000,0.1234
    preroute; tier=large; by=prices; prices=0.0000,0.1234
    preroute; tier=large; by=one-tier
    forced; tier=large
    cascade; small=accepted 0.8889>=0.5000
    cascade; small=escalated 0.1111<0.5000; large=final
    cascade; small=judge-failed; large=final
    cascade; small=unjudged 503

- ``by=threshold``: the router's score ``S`` and the thresholds around the chosen tier: tier k serves
  ``t[k-1] < S <= t[k]`` (``above`` is t[k-1], absent for the first tier; ``upto`` is t[k], absent for the last),
  the rule of :meth:`router.routing.RoutePolicy.tier_for_score`.
- ``by=prices``: a multi router under per-tier prices lambda_k, tier = argmax_k p_k(S) - lambda_k; ``score`` is
  its difficulty S, absent for a router of independent heads (format /1), whose p_k are not one score's.
- ``by=one-tier``: the plan loads one tier (one tier, or fractions that give all the load to one): nothing is
  compared. ``forced``: the request's ``model`` named the tier.
- ``cascade``: one field per tier asked, in order, ``<tier>=<verdict>[ <detail>]``: ``accepted S>=T`` (the
  judge's score reached the hop's threshold), ``escalated S<T``, ``judge-failed`` (the judge could not score the
  answer: it escalates, as a score of 0 would), ``final`` (the last tier: answered, not judged), ``unjudged
  STATUS`` (an earlier tier answered an error, passed on as is).

Figures are rounded to 4 decimals (``inf`` where a threshold or price is infinite), so a score within 5e-5 of
its threshold can print equal to it. The fixed parts of every reason are cut once per compiled plan
(:class:`RouteReasons`); a request pays one float format and one string join (about a microsecond).
Kept light to import (no numpy): the load generator reads the header name from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: the response header (and the access log's ``reason`` field)
HEADER = "x-boute-reason"
#: a cascade's reason starts with this; its hops' fields follow
CASCADE = "cascade"
#: the verdicts a cascade hop can carry
VERDICTS = ("accepted", "escalated", "judge-failed", "final", "unjudged")


def fmt(x: float) -> str:
    """A score, threshold or price as the header writes it: 4 decimals, ``inf``/``-inf`` where infinite."""
    return f"{x:.4f}"


class RouteReasons:
    """The reason strings of one compiled plan, their fixed parts built once (the plan's thresholds and prices
    formatted, the tier names placed); the request path only formats its score into them."""

    __slots__ = ("_head", "_tail", "_forced", "_accepted", "_escalated", "_failed", "_final", "_unjudged")

    def __init__(self, tiers: Sequence[str]) -> None:
        self._forced = tuple(f"forced; tier={t}" for t in tiers)
        #: pre-route: per tier, the reason up to its score and after it (``_tail`` None: no score, ``_head`` whole)
        self._head: tuple[str, ...] = ()
        self._tail: tuple[str | None, ...] = ()
        #: cascade: per hop, the fixed parts of its field (each with its leading "; ")
        self._accepted: tuple[tuple[str, str], ...] = ()
        self._escalated: tuple[tuple[str, str], ...] = ()
        self._failed = tuple(f"; {t}=judge-failed" for t in tiers)
        self._final = tuple(f"; {t}=final" for t in tiers)
        self._unjudged = tuple(f"; {t}=unjudged " for t in tiers)

    @classmethod
    def by_thresholds(cls, tiers: Sequence[str], thresholds: Sequence[float]) -> RouteReasons:
        """Pre-route by thresholds (``len(tiers) - 1`` of them): tier k serves ``t[k-1] < score <= t[k]``."""
        r = cls(tiers)
        last = len(tiers) - 1
        r._head = tuple(f"preroute; tier={t}; by=threshold; score=" for t in tiers)
        r._tail = tuple(
            (f"; above={fmt(thresholds[k - 1])}" if k > 0 else "")
            + (f"; upto={fmt(thresholds[k])}" if k < last else "")
            for k in range(len(tiers))
        )
        return r

    @classmethod
    def by_prices(cls, tiers: Sequence[str], prices: Sequence[float], scored: bool) -> RouteReasons:
        """Pre-route by a multi router under ``prices``; ``scored``: its score is a difficulty worth printing."""
        r = cls(tiers)
        listed = f"; prices={','.join(fmt(p) for p in prices)}"
        if scored:
            r._head = tuple(f"preroute; tier={t}; by=prices; score=" for t in tiers)
            r._tail = (listed,) * len(tiers)
        else:
            r._head = tuple(f"preroute; tier={t}; by=prices{listed}" for t in tiers)
            r._tail = (None,) * len(tiers)
        return r

    @classmethod
    def one_tier(cls, tiers: Sequence[str]) -> RouteReasons:
        """A pre-route that loads one tier: nothing is compared."""
        r = cls(tiers)
        r._head = tuple(f"preroute; tier={t}; by=one-tier" for t in tiers)
        r._tail = (None,) * len(tiers)
        return r

    @classmethod
    def cascade(cls, tiers: Sequence[str], thresholds: Sequence[float]) -> RouteReasons:
        """A cascade judged against ``thresholds[hop]`` at every hop but the last."""
        r = cls(tiers)
        r._accepted = tuple((f"; {t}=accepted ", f">={fmt(thr)}") for t, thr in zip(tiers, thresholds, strict=False))
        r._escalated = tuple((f"; {t}=escalated ", f"<{fmt(thr)}") for t, thr in zip(tiers, thresholds, strict=False))
        return r

    # ---- the request path ---------------------------------------------------------------------
    def preroute(self, tier: int, score: float) -> str:
        tail = self._tail[tier]
        if tail is None:
            return self._head[tier]
        return f"{self._head[tier]}{score:.4f}{tail}"

    def forced(self, tier: int) -> str:
        return self._forced[tier]

    def accepted(self, hop: int, score: float) -> str:
        """Hop ``hop``'s field when its answer was kept (appended to ``"cascade"``)."""
        head, tail = self._accepted[hop]
        return f"{head}{score:.4f}{tail}"

    def escalated(self, hop: int, score: float, failed: bool) -> str:
        """Hop ``hop``'s field when its answer was passed over (``failed``: the judge could not score it)."""
        if failed:
            return self._failed[hop]
        head, tail = self._escalated[hop]
        return f"{head}{score:.4f}{tail}"

    def final(self, hop: int) -> str:
        return self._final[hop]

    def unjudged(self, hop: int, status: int) -> str:
        return f"{self._unjudged[hop]}{status}"


# ---- reading ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hop:
    """One cascade hop as its field reads: the tier asked, its verdict, the judge's score and the threshold."""

    tier: str
    verdict: str
    score: float | None = None
    threshold: float | None = None
    status: int | None = None


@dataclass(frozen=True)
class Reason:
    """One ``x-boute-reason`` value, read. ``tier``: the tier that answered (a cascade's last hop)."""

    how: str  # preroute | forced | cascade
    tier: str
    by: str | None = None  # pre-route: threshold | prices | one-tier
    score: float | None = None
    above: float | None = None
    upto: float | None = None
    prices: tuple[float, ...] | None = None
    hops: tuple[Hop, ...] = ()

    def consistent(self) -> bool:
        """The reason agrees with itself: a threshold pre-route's score lies in its tier's range, each judged hop's
        verdict follows from its score and threshold, and only the last hop answers unjudged by a verdict.
        Non-strict comparisons: the figures are rounded (a score a hair above its threshold may print equal)."""
        if self.how == "preroute" and self.by == "threshold" and self.score is not None:
            lo = -math.inf if self.above is None else self.above
            hi = math.inf if self.upto is None else self.upto
            return lo <= self.score <= hi
        for i, h in enumerate(self.hops):
            ends = i == len(self.hops) - 1
            if h.verdict in ("accepted", "final", "unjudged") and not ends:
                return False
            if h.verdict in ("escalated", "judge-failed") and ends:
                return False
            if h.score is not None and h.threshold is not None:
                ok = h.score >= h.threshold if h.verdict == "accepted" else h.score <= h.threshold
                if not ok:
                    return False
        return True


def _num(text: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{HEADER}: not a number {value!r} in {text!r}") from None


def _hop(text: str, tier: str, value: str) -> Hop:
    verdict, _, detail = value.partition(" ")
    if verdict not in VERDICTS:
        raise ValueError(f"{HEADER}: unknown verdict {verdict!r} in {text!r}")
    if verdict == "unjudged":
        return Hop(tier, verdict, status=int(_num(text, detail)))
    if verdict in ("accepted", "escalated"):
        op = ">=" if verdict == "accepted" else "<"
        score, sep, thr = detail.partition(op)
        if not sep:
            raise ValueError(f"{HEADER}: {verdict} needs SCORE{op}THRESHOLD in {text!r}")
        return Hop(tier, verdict, _num(text, score), _num(text, thr))
    return Hop(tier, verdict)


def parse_reason(text: str) -> Reason:
    """Read one header value (ValueError naming it when it is not one the gateway writes)."""
    how, *fields = text.split("; ")
    pairs = []
    for f in fields:
        key, sep, value = f.partition("=")
        if not sep:
            raise ValueError(f"{HEADER}: field {f!r} is not key=value in {text!r}")
        pairs.append((key, value))
    if how == CASCADE:
        hops = tuple(_hop(text, k, v) for k, v in pairs)
        if not hops:
            raise ValueError(f"{HEADER}: a cascade with no hop: {text!r}")
        return Reason(CASCADE, hops[-1].tier, hops=hops)
    if how not in ("preroute", "forced"):
        raise ValueError(f"{HEADER}: unknown kind {how!r} in {text!r}")
    d = dict(pairs)
    if "tier" not in d:
        raise ValueError(f"{HEADER}: no tier in {text!r}")
    prices = tuple(_num(text, p) for p in d["prices"].split(",")) if "prices" in d else None
    return Reason(
        how,
        d["tier"],
        by=d.get("by"),
        score=_num(text, d["score"]) if "score" in d else None,
        above=_num(text, d["above"]) if "above" in d else None,
        upto=_num(text, d["upto"]) if "upto" in d else None,
        prices=prices,
    )
