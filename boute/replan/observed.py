"""From a plan and what the gateways saw: the plan's promise (for the detector) and the scenario a new plan
is optimised for (the observed workload on the fleet that is actually healthy)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import numpy as np

from boute.errors import BouteError
from boute.quality.router_kinds import router_kind
from boute.quality.shares import mix_weights, systematic_resample
from boute.replan.drift import Promise
from boute.replan.window import Window, group_key
from boute.serving.bundle import plan_scenario
from boute.specs import Plan, ReplicaGroup, Scenario
from boute.specs.scenario import ScoreMix

#: a re-plan sizes for the observed rate times this: a plan born at its own edge re-triggers at once
RATE_HEADROOM = 1.10
#: router-score bins of an observed mix (deciles of the plan's reference scores)
MIX_BINS = 10


def rate_band(sc: Scenario, rate_rps: float, window_s: float, q: float = 0.005) -> tuple[float, float]:
    """The ``q`` and ``1 - q`` quantiles of the rate the scenario's own arrival process shows over windows of
    ``window_s`` seconds, relative to its mean: how far a window of *planned* traffic strays by itself.

    The plan's promise was judged on that very process (the trace's minute-scale swings included: over
    30 s windows the built-in trace ranges 0.72-1.37x its mean), so a window inside the band is the plan's
    own traffic, not drift. An hour of the process, windows every sixth of a span."""
    from boute.workload import build_workload

    w = build_workload(sc, rate_rps=rate_rps, duration_s=max(3600.0, 60.0 * window_s), seed=0)
    horizon = float(w.arrival_s[-1]) if len(w.arrival_s) else 0.0
    starts = np.arange(0.0, max(horizon - window_s, 0.0), window_s / 6.0)
    if len(starts) < 10:
        return 1.0, 1.0
    counts = np.searchsorted(w.arrival_s, starts + window_s) - np.searchsorted(w.arrival_s, starts)
    ratio = counts / (w.rate_rps * window_s)
    lo, hi = np.quantile(ratio, [q, 1.0 - q])
    return float(lo), float(hi)


def promise_of(
    plan: Plan,
    plan_path: str | Path,
    root: Path | None = None,
    rate_rps: float | None = None,
    window_s: float | None = None,
) -> Promise:
    """The plan's promise in the gateway's units: its scenario's rate (``rate_rps``: the load it was judged
    fit for since, when a re-plan kept it) with the band its arrival process strays within over
    ``window_s`` windows, the predicted P95, its reference prompts' lengths in characters and its own
    router's scores on them, its replica groups."""
    from boute.quality.profiles import load_profile

    sc = plan_scenario(plan, plan_path, root)
    if sc is None:
        raise BouteError(f"{plan_path}: scenario_spec: missing; re-planning needs the plan's own scenario")
    base = root or Path(plan_path).parent
    ref = plan.routing.reference or sc.quality.profile
    fmt = sc.quality.format if ref == sc.quality.profile else "auto"  # the scenario's profile, read as it says
    prompts = list(load_profile(ref if ref.startswith("builtin:") else base / ref, fmt).prompts)
    r = plan.routing
    # the plan's router's difficulty of its reference, as the gateway records it (none for a length scorer)
    scores = np.zeros(0) if r.scorer is None else router_kind(r.scorer).difficulty_scores(r, base, prompts)
    mix = sc.workload.mix
    if mix is not None and len(scores) == len(prompts):  # the plan was made for a mix: its reference, resampled
        rows = systematic_resample(mix_weights(scores, mix.edges, mix.shares), len(scores))
        prompts, scores = [prompts[i] for i in rows], scores[rows]
    groups: dict[str, int] = {}
    for g in plan.deployment:
        key = group_key(g.tier, g.gpu, g.tp, g.pp)
        groups[key] = groups.get(key, 0) + g.count
    p95 = plan.predicted.p95_latency_s if plan.predicted is not None else None
    rate = float(rate_rps if rate_rps is not None else sc.workload.rate_rps)
    return Promise(
        rate_rps=rate,
        rate_band=rate_band(sc, rate, window_s) if window_s else (1.0, 1.0),
        p95_s=p95,
        prompt_chars=np.array([len(p) for p in prompts], dtype=float),
        scores=scores,
        groups=groups,
    )


def running_fractions(plan: Plan, sc: Scenario) -> tuple[float, ...]:
    """The load shares the running plan's pre-route thresholds (or a multi router's prices) give under ``sc``'s
    mix: what the gateway does with the traffic now (its ``fractions`` are the shares of the mix it was made
    for)."""
    fr = tuple(plan.routing.fractions or ())
    r = plan.routing
    if r.mode != "preroute" or sc.workload.mix is None or r.scorer is None:
        return fr
    from boute.quality import quality_model_for

    shares = router_kind(r.scorer).running_fractions(r, sc.quality.router_kind, lambda: quality_model_for(sc))
    return fr if shares is None else tuple(float(f) for f in shares)


def healthy_deployment(plan: Plan, w: Window) -> list[ReplicaGroup]:
    """The plan's replica groups as they stand: each with only its healthy replicas (empty groups dropped)."""
    out = []
    for g in plan.deployment:
        n = min(g.count, w.healthy.get(group_key(g.tier, g.gpu, g.tp, g.pp), 0))
        if n > 0:
            out.append(g.model_copy(update={"count": n}))
    return out


def input_shift(w: Window, promise: Promise) -> float:
    """Mean prompt length observed over the mean the promise assumes (1.0 when either is unknown)."""
    if not len(w.prompt_chars) or not len(promise.prompt_chars):
        return 1.0
    return float(np.mean(w.prompt_chars) / np.mean(promise.prompt_chars))


def lost_gpus(plan: Plan, w: Window) -> dict[str, int]:
    """GPUs per type the plan deployed whose replicas are not healthy now (what the fleet has lost)."""
    out: dict[str, int] = {}
    for g in plan.deployment:
        key = group_key(g.tier, g.gpu, g.tp, g.pp)
        missing = max(0, g.count - w.healthy.get(key, 0))
        if missing:
            out[g.gpu] = out.get(g.gpu, 0) + missing * g.gpus_per_replica
    return out


def observed_mix(w: Window, promise: Promise, bins: int = MIX_BINS) -> ScoreMix | None:
    """The window's router scores as a mix over bins cut at the promise's score quantiles (None when the plan
    routes without a learned scorer or the window holds too few scores to fill the bins)."""
    if len(promise.scores) < bins or len(w.scores) < 10 * bins:
        return None
    edges = np.unique(np.quantile(promise.scores, np.linspace(0.0, 1.0, bins + 1)[1:-1]))
    counts = np.bincount(np.searchsorted(edges, w.scores, side="left"), minlength=len(edges) + 1)
    return ScoreMix(edges=edges.tolist(), shares=(counts / counts.sum()).tolist())


def observed_scenario(
    sc: Scenario,
    plan: Plan,
    w: Window,
    promise: Promise,
    answer_baseline: np.ndarray | None,
    shifted: Collection[str],
    headroom: float = RATE_HEADROOM,
    rate_rps: float | None = None,
) -> Scenario:
    """``sc`` with the observed workload and the healthy fleet:

    - rate: the observed rate (``rate_rps``: a more recent estimate, when given) times ``headroom``;
    - mix: the window's router-score mix (:func:`observed_mix`): which prompts the traffic holds decides the
      tier loads and the quality a routing gets, so harder traffic is planned as harder, not as longer;
    - lengths: for each length condition in ``shifted`` (the detector's ``prompt_mix`` / ``answer_mix``), the
      observed shift (prompts against the plan's reference, answers against the first window the plan
      served) beyond what the change of mix explains by itself;
    - inventory: GPUs of replica groups that are down are taken out (a lost GPU type ends with none).
    """
    from boute.workload import profile_mean_lengths

    wl = sc.workload
    mix = observed_mix(w, promise) or wl.mix
    moved = profile_mean_lengths(sc.model_copy(update={"workload": wl.model_copy(update={"mix": mix})}))
    before = profile_mean_lengths(sc)
    explained = (1.0, 1.0) if moved is None or before is None else (moved[0] / before[0], moved[1] / before[1])
    lengths = wl.lengths
    if "prompt_mix" in shifted:
        scale = lengths.input_scale * input_shift(w, promise) / explained[0]
        lengths = lengths.model_copy(update={"input_scale": scale})
    if "answer_mix" in shifted and answer_baseline is not None and len(w.answer_tokens) and len(answer_baseline):
        shift = float(np.mean(w.answer_tokens) / np.mean(answer_baseline))
        lengths = lengths.model_copy(update={"output_scale": lengths.output_scale * shift / explained[1]})
    rate = max(rate_rps if rate_rps is not None else w.rate_rps, 1e-3) * headroom
    workload = wl.model_copy(update={"rate_rps": rate, "lengths": lengths, "mix": mix})
    gpus = dict(sc.cluster.gpus)
    for gpu, n in lost_gpus(plan, w).items():
        gpus[gpu] = max(0, gpus.get(gpu, 0) - n)
    kept = {g: n for g, n in gpus.items() if n > 0}
    if not kept:
        raise BouteError("re-plan: every replica group is down; no healthy GPU is left to plan on")
    prices = {g: p for g, p in sc.cluster.prices.items() if g in kept}
    cluster = sc.cluster.model_copy(update={"gpus": kept, "prices": prices})
    doc = sc.model_dump(mode="json") | {
        "workload": workload.model_dump(mode="json"),
        "cluster": cluster.model_dump(mode="json"),
    }
    from boute.specs.scenario import scenario_from_mapping

    assert sc.source is not None
    return scenario_from_mapping(doc, sc.source, sc.reference)
