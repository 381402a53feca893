"""The plan a search's outcome writes: its chosen (or confirmed) candidate as a routed, predicted plan.

:func:`build_plan` takes the outcome's final trial, routes it as the search's quality model routed it (the
pre-router or the cascade's judge on whose scores its thresholds were cut) and records the figures the
plan promises: the confirming evaluator's when the plan was confirmed, the quality model's held-out mean,
bound and per-tier shares, and the objective that chose it.
"""

from __future__ import annotations

from boute.optimize.evaluators.base import EvalResult, candidate_plan
from boute.optimize.outcome import Outcome
from boute.specs import Plan, Prediction, Scenario


def build_plan(
    scenario: Scenario,
    out: Outcome,
    mode: str,
    router: str | None = None,
    verifier: str | None = None,
    judge_model: str | None = None,
    scorer: str = "ladder",
) -> Plan:
    """The final plan, routed by ``router`` (a ``scorer``: ``ladder`` or ``multi``) or (a
    cascade) judged by ``verifier`` or the LLM judge ``judge_model``: the search's quality model's router or
    judge, on whose scores its thresholds (or prices) were cut."""
    t = out.final
    assert t is not None and t.result is not None
    r = out.confirmed.get(t.index, t.result)
    cut = t.result.thresholds or None
    plan = candidate_plan(
        scenario,
        t.candidate,
        mode,
        cut,
        router=router,
        verifier=verifier,
        judge_model=judge_model,
        scorer=scorer,
        prices=t.result.prices,
    )
    q = r.extra.quality or {}  # an exact quality model's held-out mean and bound (a live result has none)
    pred = Prediction(
        quality=q.get("mean", r.quality),
        quality_bound=q.get("bound"),
        quality_confidence=q.get("level"),
        floor_on=scenario.targets.floor_on,
        p95_latency_s=r.p95_latency_s,
        p50_latency_s=r.p50_latency_s,
        mean_latency_s=r.mean_latency_s,
        throughput_rps=r.throughput_rps,
        cost_per_hour=r.cost_per_hour,
        evaluator=r.evaluator,
        feasible=r.feasible,
        tier_shares=_predicted_shares(r) or _predicted_shares(t.result),
        cached_token_share=r.extra.cached_token_share,
        ttft_p50_s=r.extra.ttft_p50_s,
        ttft_p95_s=r.extra.ttft_p95_s,
    )
    return plan.model_copy(update={"predicted": pred, "objective": out.objective.label})


def _predicted_shares(r: EvalResult) -> list[float] | None:
    """The predicted per-tier shares (exact evaluators: the simulated stream's, or the fast path's held-out
    prompts'; a live result measures the shares its answers came from, ``answered_shares``, which are not a
    prediction)."""
    shares = r.extra.tier_shares
    return None if shares is None else list(shares)
