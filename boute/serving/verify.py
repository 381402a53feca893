"""Promised vs measured: how ``boute verify`` judges what came back (what it replays is
:mod:`boute.serving.replay_requests`).

The promise is the plan's: the share of requests each tier gets (its routing fractions), the quality and
P95 the optimiser predicted (``plan.predicted``). The measurement replays the plan's own scenario workload
(its arrival process and rate) with the quality profile's *held-out* prompts, the ones the promised quality
was computed on (the router's training prompts would flatter it), and scores every answer with the
profile's quality for the tier that answered. A check passes within its tolerance; ``failed`` must be 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from boute.quality.confidence import DEFAULT_LEVEL
from boute.quality.profiles import QualityProfile
from boute.specs.plan import Plan, Prediction
from boute.stats import quantile


@dataclass(frozen=True)
class Tolerances:
    share: float = 0.02  # absolute, per tier
    quality: float = 0.02  # absolute
    p95_rel: float = 0.15  # relative to the promise
    failed: int = 0
    cached_share: float = 0.05  # absolute: the simulator's hits against the replicas' reported ones


@dataclass(frozen=True)
class Measured:
    requests: int
    failed: int
    shares: dict[str, float]
    quality: float
    quality_se: float
    p50_s: float
    p95_s: float
    answers_match_profile: float | None  # share of answers that are the answering tier's recorded response
    generator_cpu_share: float  # the load generator's CPU seconds per wall second (1.0 = one core busy)
    #: share of the answered requests' prompt tokens the replicas reported cached (None: none reported)
    cached_token_share: float | None = None
    #: time to first token of the streamed answers, P50 and P95 (None: the replay did not stream)
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None


def measure(results: dict[str, Any], rows: np.ndarray, profile: QualityProfile, columns: dict[str, str]) -> Measured:
    """Score a load generator's results: ``columns`` maps tier -> the profile model column it answers as."""
    status = np.asarray(results["status"])
    ok = status == 200
    lat = np.asarray(results["latency_s"], dtype=float)[ok]
    ttft = np.asarray([t for t, good in zip(results.get("ttft_s") or [], ok, strict=False) if good and t is not None])
    tiers = [t for t, good in zip(results["tier"], ok, strict=True) if good]
    shares = {t: tiers.count(t) / max(1, len(tiers)) for t in sorted(set(tiers), key=str)}
    scores: list[float] = []
    matched = counted = 0
    for i in np.flatnonzero(ok):
        tier, row = results["tier"][i], int(rows[i])
        model = columns.get(tier or "")
        if model is None:
            scores.append(0.0)  # an answer from no known tier earns nothing
            continue
        scores.append(float(profile.scores[row, profile.models.index(model)]))
        recorded = profile.responses.get(model)
        if recorded is not None:
            counted += 1
            matched += results["text"][i] == recorded[row]
    n = len(scores)
    return Measured(
        requests=len(status),
        failed=int((~ok).sum()),
        shares=shares,
        quality=float(np.mean(scores)) if n else 0.0,
        quality_se=float(np.std(scores, ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
        p50_s=quantile(lat, 0.50) if lat.size else math.inf,
        p95_s=quantile(lat, 0.95) if lat.size else math.inf,
        answers_match_profile=matched / counted if counted else None,
        generator_cpu_share=float(results["cpu_s"]) / max(1e-9, float(results["wall_s"])),
        cached_token_share=cached_share(results, ok),
        ttft_p50_s=quantile(ttft, 0.50) if ttft.size else None,
        ttft_p95_s=quantile(ttft, 0.95) if ttft.size else None,
    )


def cached_share(results: dict[str, Any], ok: np.ndarray) -> float | None:
    """Reported cached prompt tokens over reported prompt tokens, over the answered requests that report both
    (SGLang reports ``cached_tokens`` only with ``--enable-cache-report``; None when no answer did)."""
    pairs = [
        (c, p)
        for c, p, good in zip(results.get("cached_tokens") or [], results.get("prompt_tokens") or [], ok, strict=False)
        if good and c is not None and p
    ]
    return sum(c for c, _ in pairs) / sum(p for _, p in pairs) if pairs else None


@dataclass(frozen=True)
class Check:
    name: str
    promised: float | None
    measured: float
    tolerance: str
    ok: bool


@dataclass(frozen=True)
class Verdict:
    checks: list[Check]
    measured: Measured
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": [asdict(c) for c in self.checks],
            "measured": asdict(self.measured),
            "notes": self.notes,
        }


def _cascade_checks(tiers: list[str], promised: list[float], shares: dict[str, float], tol: Tolerances) -> list[Check]:
    """A cascade's escalation rate and each hop's acceptance, promised vs measured.

    With ``s_k`` the share answered at tier k, the queries reaching hop k are ``v_k = s_k + ... + s_N``
    (:func:`boute.quality.shares.cascade_visits`): the escalation rate is ``1 - s_0`` and hop k accepts
    ``s_k / v_k`` of what reaches it. Both follow from the shares, but a judge that accepts too much shows
    up here as itself, hop by hop."""
    from boute.quality.shares import cascade_visits

    got = [float(shares.get(t, 0.0)) for t in tiers]
    within = f"+-{tol.share:g}"
    out = [Check("escalated", 1.0 - promised[0], 1.0 - got[0], within, abs(got[0] - promised[0]) <= tol.share + 1e-12)]
    pv, gv = cascade_visits(promised), cascade_visits(got)
    for k, tier in enumerate(tiers[:-1]):
        p = float(promised[k] / pv[k]) if pv[k] > 1e-12 else 1.0
        g = float(got[k] / gv[k]) if gv[k] > 1e-12 else 1.0
        out.append(Check(f"accepted at {tier}", p, g, within, abs(g - p) <= tol.share + 1e-12))
    return out


def _cache_checks(pred: Prediction | None, m: Measured, tol: Tolerances) -> list[Check]:
    """The promised share of prompt tokens served from prefix caches against the replicas' reports: judged
    where both exist, reported where only the measurement does (a plan of traffic without shared prefixes);
    and time to first token, reported beside the promise (the simulator's), where the replay streamed."""
    out: list[Check] = []
    for name, promised, got in (
        ("TTFT P50 (s)", pred.ttft_p50_s if pred else None, m.ttft_p50_s),
        ("TTFT P95 (s)", pred.ttft_p95_s if pred else None, m.ttft_p95_s),
    ):
        if got is not None:
            out.append(Check(name, promised, got, "reported", True))
    if m.cached_token_share is None:
        return out
    promised = pred.cached_token_share if pred is not None else None
    if promised is None:
        return [*out, Check("cached token share", None, m.cached_token_share, "reported", True)]
    ok = abs(m.cached_token_share - promised) <= tol.cached_share + 1e-12
    return [*out, Check("cached token share", promised, m.cached_token_share, f"+-{tol.cached_share:g}", ok)]


def compare(plan: Plan, m: Measured, tol: Tolerances = Tolerances(), *, capped_at: int | None = None) -> Verdict:
    """Each promise against its measurement; a promise the plan does not make is reported, not checked.

    ``capped_at``: the replay capped answers at that many tokens (``--max-tokens``); latencies then measure
    shorter answers than the promise is about, so P95 is reported beside it, not judged, and a note says so.
    Shares, quality (the profile's score of the answering tier's recorded answer) and failures still hold."""
    checks: list[Check] = []
    notes: list[str] = []
    if capped_at is not None:
        notes.append(
            f"answers capped at {capped_at} tokens (--max-tokens): lengths differ from the plan's promise, so "
            "P50/P95 are reported, not judged; quality is the profile's score for the answering tier"
        )
    r = plan.routing
    pred = plan.predicted
    # the share promised for the prompts replayed (held-out): the plan's prediction; its routing fractions
    # hold on the whole reference, from which a small held-out set can differ (MT-Bench: 48 prompts)
    promised = pred.tier_shares if pred is not None and pred.tier_shares is not None else r.fractions
    if promised is not None:
        # pre-route: the share each tier is sent; cascade: the share whose answer each tier's hop accepts
        for tier, f in zip(r.tiers, promised, strict=True):
            got = m.shares.get(tier, 0.0)
            checks.append(Check(f"share {tier}", f, got, f"+-{tol.share:g}", abs(got - f) <= tol.share + 1e-12))
        if r.mode == "cascade":
            checks += _cascade_checks(r.tiers, list(promised), m.shares, tol)
        if promised is not r.fractions and r.fractions is not None:
            fr = ", ".join(f"{t} {f:.3f}" for t, f in zip(r.tiers, r.fractions, strict=True))
            notes.append(f"routing fractions on the whole reference: {fr}")
    if pred is not None and pred.quality is not None:
        checks.append(
            Check(
                "quality", pred.quality, m.quality, f"+-{tol.quality:g}", abs(m.quality - pred.quality) <= tol.quality
            )
        )
    if pred is not None and pred.quality_bound is not None:
        # the promise's lower bound beside the measured mean: reported, not judged (the replay draws the held-out
        # prompts the bound was computed on, with repeats, so it cannot test the bound's coverage; the
        # quality check above judges the mean)
        level = pred.quality_confidence or DEFAULT_LEVEL
        name = f"quality {level:.0%} LCB" + (" (floor)" if pred.floor_on == "bound" else "")
        checks.append(Check(name, pred.quality_bound, m.quality, "reported", True))
    if pred is not None and pred.p50_latency_s is not None:  # shown beside P95, not judged
        checks.append(Check("P50 (s)", pred.p50_latency_s, m.p50_s, "reported", True))
    if pred is not None and pred.p95_latency_s is not None:
        rel = m.p95_s / pred.p95_latency_s - 1.0
        if capped_at is not None:
            checks.append(Check("P95 (s)", pred.p95_latency_s, m.p95_s, "reported (capped)", True))
        else:
            checks.append(
                Check("P95 (s)", pred.p95_latency_s, m.p95_s, f"+-{tol.p95_rel:.0%}", abs(rel) <= tol.p95_rel)
            )
    checks += _cache_checks(pred, m, tol)
    if pred is None:
        notes.append("the plan carries no prediction: only shares and failures are checked")
    checks.append(
        Check("failed requests", float(tol.failed), float(m.failed), f"<= {tol.failed}", m.failed <= tol.failed)
    )
    if m.generator_cpu_share > 0.8:
        notes.append(f"the load generator used {m.generator_cpu_share:.0%} of a core: it may have delayed requests")
    return Verdict(checks, m, notes)
