"""The fast path where prefill sets the pace (issue 27): the operating point's solves, and agreement with the
simulator on the shapes the random-scenario benchmark found it far off on (bench/bench_fastpath_random.py).

Each agreement test compares the fast path with the mean of two simulated seeds (each its own workload at
the same rate): one seed's P95 moves by ~5-10% at these shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.random_scenarios import random_scenario
from boute.catalog import builtin_catalog
from boute.perf import replica_perf
from boute.sim import fast_evaluate, simulate
from boute.sim.capacity import Lengths, operating_point
from boute.sim.timing import build_timing
from boute.specs import Plan, load_scenario
from boute.workload import build_workload, tier_workload_stats, workload_stats


def _timing(model: str, gpu: str, tp: int):  # type: ignore[no-untyped-def]
    cat = builtin_catalog()
    return build_timing(replica_perf(cat.model(model), cat.gpu(gpu), tp=tp))


def test_operating_point_is_the_smallest_fixed_point_and_grows_with_the_rate() -> None:
    """Secant steps from b = 1 overshot past the KV limit and called this replica batch-full (2,048) at
    169 req/s but not at 187 (1,293): the bracketed solve finds the fixed point ~850 and is monotone."""
    tm = _timing("llama-3.2-3b", "rtx-pro-6000", 2)
    ln = Lengths(46.0, 46.0 * 46.0 * 1.3, 86.0, 86.0 * 86.0 * 1.5)
    ops = [operating_point(tm, lam, ln) for lam in (1.0, 20.0, 100.0, 150.0, 169.0, 187.0, 200.0)]
    batches = [op.batch for op in ops]
    assert batches == sorted(batches) and 700 < ops[4].batch < 1000
    for op in ops:  # each is a fixed point of b = lam E[out] step(b) / (1 - phi)
        assert op.batch == pytest.approx(op.lam * ln.mean_out * op.step_s / (1 - op.prefill_share), rel=1e-3)


def _single_replica_scenario():  # type: ignore[no-untyped-def]
    sc = load_scenario("builtin:paper-gsm8k")
    wl = sc.workload
    arrivals = wl.arrivals.model_copy(update={"kind": "poisson"})
    lengths = wl.lengths.model_copy(
        update={"source": "lognormal", "input_tokens": 2000, "output_tokens": 28, "sigma": 0.5, "max_input": 16384}
    )
    return sc.model_copy(update={"workload": wl.model_copy(update={"arrivals": arrivals, "lengths": lengths})})


def test_prefill_saturating_a_replica_slows_its_decode_as_simulated() -> None:
    """Issue 27's mechanism: long prompts keep a 70B replica's prefill stage ~80% busy, so every decode step
    waits for prefills (mean TPOT ~5x the step). The prompts-per-prefill fixed point stopped after two
    rounds, putting the prefill share at 0.76 (simulated 0.82): the fast P95 was 8.1 s against a simulated
    13.6 s (-40%). Converged, the share is 0.82 and the P95 within 20%."""
    sc = _single_replica_scenario()
    plan = Plan.model_validate(
        {
            "routing": {"tiers": ["large"], "fractions": [1.0], "scorer": "length", "reference": "builtin:gsm8k"},
            "deployment": [{"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4}],
        }
    )
    probe = workload_stats(build_workload(sc, rate_rps=5.0, duration_s=600.0))
    rate = 0.8 * fast_evaluate(plan.deployment, sc, probe, [1.0], ["large"]).capacity_rps
    tm = _timing("llama-3.1-70b", "h100-sxm", 4)
    ln = Lengths(probe.mean_input, probe.input_sq_mean, probe.mean_output, probe.output_sq_mean)
    assert operating_point(tm, rate, ln).prefill_share == pytest.approx(0.82, abs=0.03)
    ratios = []
    for seed in (0, 1):
        w = build_workload(sc, rate_rps=rate, duration_s=8000 / rate, seed=seed)
        fast = fast_evaluate(plan.deployment, sc, workload_stats(w), [1.0], ["large"])
        sim = simulate(plan, sc, w, seed=seed).summary()
        assert sim["throughput_rps"] > 0.95 * sim["offered_rps"]  # a steady state exists
        ratios.append(fast.p95_latency_s / sim["p95_latency_s"])
    assert abs(float(np.mean(ratios)) - 1.0) <= 0.2, ratios


#: random scenario 14 (code-completion lengths: ~2,000 prompt / ~14 answer tokens, Poisson 24.5 req/s): the
#: cheapest of 256 random plans the fast path said met the 4.7 s cap
SEED14_PLAN = {
    "routing": {
        "tiers": ["small", "mid", "large"],
        "fractions": [0.6824, 0.0857, 0.2319],
        "scorer": "length",
        "reference": "builtin:gsm8k",
    },
    "deployment": [
        {"tier": "small", "model": "llama-3.2-1b", "gpu": "h100-pcie", "count": 1},
        {"tier": "small", "model": "llama-3.2-1b", "gpu": "l40s", "count": 1},
        {"tier": "mid", "model": "llama-3.2-3b", "gpu": "l40s", "count": 1},
        {"tier": "large", "model": "qwen2.5-32b", "gpu": "h100-pcie", "count": 2},
    ],
}


def test_a_random_prefill_heavy_plan_agrees_with_simulation() -> None:
    """Before: fast P95 18% below the simulated one (4.48 s vs 5.47 s, two seeds); now within 15%. The
    fast path gets the tier loads (and lengths) the simulation routes."""
    sc = random_scenario(14)
    plan = Plan.model_validate(SEED14_PLAN)
    p = np.asarray(plan.routing.fractions)
    ratios = []
    for seed in (0, 1):
        w = build_workload(sc, seed=seed)
        route = np.random.default_rng(seed).choice(3, size=len(w), p=p / p.sum())
        loads = list(np.bincount(route, minlength=3) / len(w))
        stats = tier_workload_stats(w, route, 3)
        fast = fast_evaluate(plan.deployment, sc, workload_stats(w), loads, plan.routing.tiers, tier_stats=stats)
        sim = simulate(plan, sc, w, route).summary()
        assert fast.stable and fast.uncertain  # near saturation and prefill-bound: flagged for confirmation
        ratios.append(fast.p95_latency_s / sim["p95_latency_s"])
    assert abs(float(np.mean(ratios)) - 1.0) <= 0.15, ratios


def test_tier_stats_give_each_tier_its_own_lengths() -> None:
    """Routing sorts prompts by difficulty, so tiers see different lengths: a tier served longer prompts is
    slower and busier than the whole workload's average would say."""
    sc = _single_replica_scenario()
    w = build_workload(sc, rate_rps=4.0, duration_s=300.0)
    route = (w.input_tokens > np.median(w.input_tokens)).astype(np.int64)  # long prompts to tier 1
    per = tier_workload_stats(w, route, 3)
    whole = workload_stats(w)
    assert per[0].mean_input < whole.mean_input < per[1].mean_input
    assert per[2] == whole  # no request: the whole workload's lengths
    assert all(t.rate_rps == whole.rate_rps and t.arrival_cv == whole.arrival_cv for t in per)
    dep = Plan.model_validate(
        {
            "routing": {"tiers": ["a", "b"], "fractions": [0.5, 0.5], "scorer": "length", "reference": "builtin:gsm8k"},
            "deployment": [
                {"tier": "a", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 1},
                {"tier": "b", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 1},
            ],
        }
    ).deployment
    same = fast_evaluate(dep, sc, whole, [0.5, 0.5], ["a", "b"])
    split = fast_evaluate(dep, sc, whole, [0.5, 0.5], ["a", "b"], tier_stats=per[:2])
    assert same.utilisation[0] == pytest.approx(same.utilisation[1])
    assert split.utilisation[1] > same.utilisation[1] > split.utilisation[0]
    with pytest.raises(ValueError, match="tier_stats"):
        fast_evaluate(dep, sc, whole, [0.5, 0.5], ["a", "b"], tier_stats=per)
    with pytest.raises(ValueError, match="route"):
        tier_workload_stats(w, route[:-1], 2)
