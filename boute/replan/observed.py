"""From a plan and what the gateways saw: the plan's promise (for the detector) and the scenario a new plan
is optimised for (the observed workload on the fleet that is actually healthy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from boute.errors import BouteError
from boute.replan.drift import Promise, Trigger
from boute.replan.window import Window, group_key
from boute.serving.bundle import plan_scenario
from boute.specs import Plan, ReplicaGroup, Scenario

#: a re-plan sizes for the observed rate times this: a plan born at its own edge re-triggers at once
RATE_HEADROOM = 1.10


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
    scores = np.zeros(0)
    if plan.routing.scorer == "learned" and plan.routing.router:
        from boute.quality.router import load_router

        scores = np.asarray(load_router(base / plan.routing.router).score(prompts))
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


def observed_scenario(
    sc: Scenario,
    plan: Plan,
    w: Window,
    promise: Promise,
    answer_baseline: np.ndarray | None,
    fired: Sequence[Trigger],
    headroom: float = RATE_HEADROOM,
    rate_rps: float | None = None,
) -> Scenario:
    """``sc`` with the observed workload and the healthy fleet:

    - rate: the observed rate (``rate_rps``: a more recent estimate, when given) times ``headroom``;
    - lengths: prompt and answer lengths scaled by the observed shift when a mix trigger fired (prompts
      against the plan's reference, answers against the first window the plan served);
    - inventory: GPUs of replica groups that are down are taken out (a lost GPU type ends with none).
    """
    kinds = {t.kind for t in fired}
    wl = sc.workload
    lengths = wl.lengths
    if "prompt_mix" in kinds:
        lengths = lengths.model_copy(update={"input_scale": lengths.input_scale * input_shift(w, promise)})
    if "answer_mix" in kinds and answer_baseline is not None and len(w.answer_tokens) and len(answer_baseline):
        shift = float(np.mean(w.answer_tokens) / np.mean(answer_baseline))
        lengths = lengths.model_copy(update={"output_scale": lengths.output_scale * shift})
    rate = max(rate_rps if rate_rps is not None else w.rate_rps, 1e-3) * headroom
    workload = wl.model_copy(update={"rate_rps": rate, "lengths": lengths})
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
