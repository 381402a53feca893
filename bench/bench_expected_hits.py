"""The fast path's expected prefix-cache hits (boute/sim/expected_hits.py) against the simulator's caches.

Issue 51 item 1: the prefix-cache model's expected hit rates enter the analytical fast path (the ``fast``
evaluator, and the prior of the default simulator search). Each case draws, at random:

- a scenario: ``builtin:shared-system-prompt`` or ``builtin:mtbench-conversations`` with its ``prefixes``
  section redrawn (1-30 system prompts of 200-3,000 tokens, popularity zipf 0.5-1.5, or none; conversations of
  2-3 turns with think times of 2-30 s, or none; at least one of the two) and its balancing (least load or
  prefix affinity);
- a plan: a uniform point of the search space, decoded (so a deployment within the budget), kept if the
  simulator serves it (finite P95).

Per case: the simulator's cached-token share against the fast path's expected share, and the fast path's P95
with its hits and without (every prompt charged in full, as before) against the simulator's. Figures: mean
absolute error of the share; median absolute relative error of P95 and Spearman's rank correlation with the
simulator's P95 (what the search's prior needs: the shape), with and without hits.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

SCENARIOS = ("builtin:shared-system-prompt", "builtin:mtbench-conversations")


def _prefixes(rng: np.random.Generator) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    while not spec:
        if rng.random() < 0.7:
            lo = int(rng.integers(200, 2000))
            spec["system_prompts"] = {
                "count": int(rng.integers(1, 31)),
                "min_tokens": lo,
                "max_tokens": int(rng.integers(lo, 3001)),
                "zipf": round(float(rng.uniform(0.5, 1.5)), 2),
            }
        if rng.random() < 0.6:
            spec["conversations"] = {"turns": int(rng.integers(2, 4)), "think_s": round(float(rng.uniform(2, 30)), 1)}
    return spec


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 else float("nan")


def _case(rng: np.random.Generator) -> dict[str, Any] | None:
    from boute.optimize.evaluators.fast import FastEvaluator
    from boute.optimize.evaluators.sim import SimEvaluator
    from boute.optimize.space import Space
    from boute.quality import quality_model_for
    from boute.specs import load_scenario
    from boute.specs.balancing import Affinity
    from boute.specs.scenario import with_affinity
    from boute.workload import replay_workload
    from tests.prefixed import with_prefixes

    name = SCENARIOS[int(rng.integers(len(SCENARIOS)))]
    spec, affinity = _prefixes(rng), bool(rng.random() < 0.5)
    sc = with_affinity(
        with_prefixes(load_scenario(name), spec, seed=int(rng.integers(1000))), Affinity(enabled=affinity)
    )
    qm = quality_model_for(sc)
    w = replay_workload(sc, qm.test_index)
    fast, sim = FastEvaluator(sc, quality_model=qm, workload=w), SimEvaluator(sc, quality_model=qm, workload=w)
    space = Space.build(sc)
    for _ in range(20):  # a plan the simulator serves
        cand = space.decode(rng.random(space.dim))
        s = sim(cand)
        if np.isfinite(s.p95_latency_s) and s.extra.cached_token_share is not None:
            break
    else:
        return None
    f = fast(cand)
    hits, fast.hits = fast.hits, None  # the same plan, every prompt charged in full
    t0 = time.perf_counter()
    full = fast(cand)
    fast.hits = hits
    return {
        "scenario": name,
        "prefixes": spec,
        "affinity": affinity,
        "plan": [f"{g.count}x {g.tier}@{g.gpu} tp{g.tp}" for g in cand.deployment],
        "fractions": [round(x, 3) for x in cand.fractions],
        "sim_cached_share": s.extra.cached_token_share,
        "fast_cached_share": f.extra.cached_token_share,
        "p95_cap_s": sc.targets.p95_latency_s,
        "sim_p95_s": s.p95_latency_s,
        "fast_p95_s": f.p95_latency_s,
        "fast_p95_no_hits_s": full.p95_latency_s,
        "fast_no_hits_ms": round((time.perf_counter() - t0) * 1e3, 2),
        "fast_ms": round(f.wall_s * 1e3, 2),
    }


def run(quick: bool = False) -> dict[str, Any]:
    rng = np.random.default_rng(51)
    n = 12 if quick else 40
    cases: list[dict[str, Any]] = []
    while len(cases) < n:
        c = _case(rng)
        if c is not None:
            cases.append(c)
            print(
                f"{c['scenario']:34s} aff={c['affinity']!s:5s} cached sim {c['sim_cached_share']:.3f} "
                f"fast {c['fast_cached_share']:.3f}  P95 sim {c['sim_p95_s']:.2f} fast {c['fast_p95_s']:.2f} "
                f"(no hits {c['fast_p95_no_hits_s']:.2f})",
                flush=True,
            )
    near = [c for c in cases if c["sim_p95_s"] <= c["p95_cap_s"]]
    summary = {"all": _summary(cases), "within_p95_cap": _summary(near)}
    summary["fast_ms_median"] = float(np.median([c["fast_ms"] for c in cases]))
    summary["fast_no_hits_ms_median"] = float(np.median([c["fast_no_hits_ms"] for c in cases]))
    return {"summary": summary, "cases": cases}


def _summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Share and P95 errors over ``cases`` (all, or those the simulator serves within the P95 cap: the plans
    a search weighs)."""
    if not cases:
        return {"cases": 0}
    err = np.array([abs(c["sim_cached_share"] - c["fast_cached_share"]) for c in cases])
    sim_p95 = np.array([c["sim_p95_s"] for c in cases])
    out: dict[str, Any] = {
        "cases": len(cases),
        "cached_share_mean_abs_err": round(float(err.mean()), 4),
        "cached_share_max_abs_err": round(float(err.max()), 4),
    }
    for key, label in (("fast_p95_s", "with_hits"), ("fast_p95_no_hits_s", "without_hits")):
        fp = np.array([c[key] for c in cases])
        out[label] = {
            "p95_median_abs_rel_err": round(float(np.median(np.abs(fp / sim_p95 - 1))), 3),
            "p95_spearman": round(_spearman(fp, sim_p95), 3),
        }
    return out
