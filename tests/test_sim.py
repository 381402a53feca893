"""Event simulator properties: load -> latency, capacity, infeasible replicas, scaling, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from boute.errors import InfeasibleError
from boute.perf import replica_perf
from boute.sim import simulate
from boute.sim.capacity import Lengths, capacity_rps
from boute.sim.timing import build_timing
from boute.specs import Plan
from boute.workload import Workload, build_workload


@pytest.fixture(scope="module")
def sc(poisson_scenario):  # type: ignore[no-untyped-def]
    return poisson_scenario


def _plan(groups: list[dict], tiers=("small",), fractions=(1.0,), mode="preroute") -> Plan:  # type: ignore[no-untyped-def]
    return Plan.model_validate(
        {
            "routing": {"mode": mode, "tiers": list(tiers), "fractions": list(fractions), "scorer": "length"}
            | {"reference": "builtin:gsm8k"},
            "deployment": groups,
        }
    )


SMALL_4090 = {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090", "count": 1}


def _capacity(sc, group: dict) -> float:  # type: ignore[no-untyped-def]
    cat = sc.catalog
    tm = build_timing(replica_perf(cat.model(group["model"]), cat.gpu(group["gpu"]), tp=group.get("tp", 1)))
    w = build_workload(sc, rate_rps=50, duration_s=60)
    i, o = w.input_tokens.astype(float), w.output_tokens.astype(float)
    return capacity_rps(tm, Lengths(i.mean(), (i * i).mean(), o.mean(), (o * o).mean()))


def test_latency_grows_with_load_and_explodes_past_capacity(sc) -> None:  # type: ignore[no-untyped-def]
    plan = _plan([SMALL_4090])
    cap = _capacity(sc, SMALL_4090)
    res = {}
    for f in (0.2, 0.6, 1.6):
        w = build_workload(sc, rate_rps=f * cap, duration_s=2000 / (f * cap))
        res[f] = simulate(plan, sc, w).summary()
    means = [res[f]["mean_latency_s"] for f in (0.2, 0.6, 1.6)]
    assert means[0] < means[1] < means[2]
    assert res[1.6]["p95_latency_s"] > 5 * res[0.2]["p95_latency_s"]  # queueing without bound
    assert res[1.6]["throughput_rps"] < 0.8 * res[1.6]["offered_rps"]  # it cannot keep up
    assert res[0.2]["throughput_rps"] > 0.85 * res[0.2]["offered_rps"]


def test_replica_that_cannot_fit_is_rejected(sc) -> None:  # type: ignore[no-untyped-def]
    plan = _plan(
        [SMALL_4090, {"tier": "large", "model": "llama-3.1-70b", "gpu": "rtx-4090", "count": 2, "tp": 1}],
        tiers=("small", "large"),
        fractions=(0.5, 0.5),
    )
    w = build_workload(sc, rate_rps=5, duration_s=5)
    with pytest.raises(InfeasibleError, match=r"deployment\[1\] \(large: 2x llama-3.1-70b on rtx-4090"):
        simulate(plan, sc, w)


def test_doubling_replicas_doubles_saturated_throughput(sc) -> None:  # type: ignore[no-untyped-def]
    cap = _capacity(sc, SMALL_4090)
    w = build_workload(sc, rate_rps=3 * 2 * cap, duration_s=3000 / (6 * cap))
    one = simulate(_plan([SMALL_4090]), sc, w).summary()["throughput_rps"]
    two = simulate(_plan([{**SMALL_4090, "count": 2}]), sc, w).summary()["throughput_rps"]
    assert 1.8 < two / one < 2.2
    assert 0.7 * cap < one < 1.3 * cap  # the analytical capacity is close to the simulated saturation


def test_deterministic_for_a_seed(sc) -> None:  # type: ignore[no-untyped-def]
    plan = _plan([SMALL_4090, {**SMALL_4090, "gpu": "rtx-5090"}])
    w = build_workload(sc, rate_rps=20, duration_s=30, seed=3)
    a = simulate(plan, sc, w, seed=3)
    b = simulate(plan, sc, build_workload(sc, rate_rps=20, duration_s=30, seed=3), seed=3)
    np.testing.assert_array_equal(a.e2e_s, b.e2e_s)
    np.testing.assert_array_equal(a.replica, b.replica)
    c = simulate(plan, sc, build_workload(sc, rate_rps=20, duration_s=30, seed=4), seed=4)
    assert not np.array_equal(a.e2e_s[:100], c.e2e_s[:100])


def test_capacity_aware_balancing_prefers_faster_replicas(sc) -> None:  # type: ignore[no-untyped-def]
    plan = _plan([SMALL_4090, {**SMALL_4090, "gpu": "h100-sxm"}])
    w = build_workload(sc, rate_rps=40, duration_s=60)
    r = simulate(plan, sc, w)
    served = np.bincount(r.replica, minlength=2)
    assert served[1] > 2 * served[0]  # the H100 has several times the 4090's capacity


def test_routing_fractions_and_cost(sc) -> None:  # type: ignore[no-untyped-def]
    plan = _plan(
        [SMALL_4090, {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4}],
        tiers=("small", "large"),
        fractions=(0.7, 0.3),
    )
    w = build_workload(sc, rate_rps=20, duration_s=60)
    r = simulate(plan, sc, w)
    s = r.summary()
    assert abs(np.mean(r.tier == 1) - 0.3) < 0.03
    assert s["cost_per_hour"] == pytest.approx(sc.price("rtx-4090") + 4 * sc.price("h100-sxm"))
    assert s["completed"] == len(w) and 0 <= s["slo_attainment"] <= 1
    for k in ("p50_latency_s", "p95_latency_s", "p99_latency_s", "mean_latency_s", "throughput_rps"):
        assert np.isfinite(s[k])
    assert s["p50_latency_s"] <= s["p95_latency_s"] <= s["p99_latency_s"]
    # per-request sanity: first token before the end, decode time = tpot * (out - 1)
    assert np.all(r.ttft_s > 0) and np.all(r.ttft_s <= r.e2e_s)
    out = w.output_at(r.tier)  # the answering tier's own answer length (GSM8K records both tiers')
    assert w.tier_output_tokens is not None and not np.array_equal(out, w.output_tokens)
    np.testing.assert_allclose(r.ttft_s + r.tpot_s * np.maximum(out - 1, 1), r.e2e_s, rtol=1e-9, atol=1e-9)


def test_cascade_serves_every_hop(sc) -> None:  # type: ignore[no-untyped-def]
    groups = [SMALL_4090, {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4}]
    w = build_workload(sc, rate_rps=5, duration_s=40)
    route = np.ones(len(w), dtype=np.int64)
    pre = simulate(_plan(groups, ("small", "large"), (0.0, 1.0)), sc, w, route=route)
    cas = simulate(_plan(groups, ("small", "large"), (0.0, 1.0), mode="cascade"), sc, w, route=route, judge_delay_s=0.2)
    # every cascade request generated on the small tier first, then waited for the judge
    assert np.all(cas.e2e_s > pre.e2e_s.min())
    assert cas.summary()["mean_latency_s"] > pre.summary()["mean_latency_s"] + 0.2
    assert cas.replica_served[0] == len(w) and cas.replica_served[1] == len(w)


def test_each_cascade_hop_generates_its_own_tiers_answer(sc) -> None:  # type: ignore[no-untyped-def]
    """A cascade hop generates the answer of the tier it is at: a small tier that answers in 8 tokens and a
    large one in 400 make the escalated request's small-tier hop short and its final answer long; giving
    every tier 400 tokens lengthens only the small-tier hop (the large tier's generation is unchanged)."""
    groups = [SMALL_4090, {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4}]
    plan = _plan(groups, ("small", "large"), (0.0, 1.0), mode="cascade")
    n = 6

    def stream(small: int) -> Workload:
        return Workload(
            arrival_s=np.arange(n, dtype=float) * 30.0,  # one at a time: no queueing
            input_tokens=np.full(n, 100, dtype=np.int64),
            output_tokens=np.full(n, 400, dtype=np.int64),
            prompt_index=np.full(n, -1, dtype=np.int64),
            rate_rps=n / 180.0,
            duration_s=180.0,
            tier_output_tokens=np.tile(np.asarray([small, 400], dtype=np.int64), (n, 1)),
        )

    route = np.ones(n, dtype=np.int64)
    short, long_ = (simulate(plan, sc, stream(k), route=route, judge_delay_s=0.0) for k in (8, 400))
    # the small replica's busy time is its own generations: 8 tokens each vs 400
    assert short.replica_busy_s[0] < 0.1 * long_.replica_busy_s[0]
    np.testing.assert_allclose(short.replica_busy_s[1], long_.replica_busy_s[1], rtol=1e-9)
    # the client's answer is the large tier's either way: same decode time per token, shorter wait before it
    np.testing.assert_allclose(short.tpot_s, long_.tpot_s, rtol=1e-9)
    assert np.all(short.e2e_s < long_.e2e_s)
    np.testing.assert_allclose(long_.e2e_s - short.e2e_s, long_.ttft_s - short.ttft_s, rtol=1e-9)


def test_an_answer_accepted_early_reaches_the_client_whole_after_the_judge(sc) -> None:  # type: ignore[no-untyped-def]
    """Accepted at tier 0 of a cascade: the gateway held the whole answer for the judge and sends it at
    once, so time to first token is the end-to-end time, and each judged hop costs ``judge_delay_s``."""
    groups = [SMALL_4090, {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4}]
    w = build_workload(sc, rate_rps=5, duration_s=40)
    route = np.zeros(len(w), dtype=np.int64)
    plan = _plan(groups, ("small", "large"), (1.0, 0.0), mode="cascade")
    fast, slow = (simulate(plan, sc, w, route=route, judge_delay_s=d) for d in (0.0, 0.5))
    np.testing.assert_allclose(slow.ttft_s, slow.e2e_s)
    np.testing.assert_allclose(slow.e2e_s - fast.e2e_s, 0.5, atol=1e-9)  # the large tier is never reached


def test_oversized_requests_are_rejected_not_lost(sc) -> None:  # type: ignore[no-untyped-def]
    n = 20
    w = Workload(
        arrival_s=np.arange(n, dtype=float) * 0.1,
        input_tokens=np.where(np.arange(n) == 5, 200_000, 100).astype(np.int64),
        output_tokens=np.full(n, 50, dtype=np.int64),
        prompt_index=np.full(n, -1, dtype=np.int64),
        rate_rps=10.0,
        duration_s=2.0,
    )
    r = simulate(_plan([SMALL_4090]), sc, w)
    s = r.summary()
    assert s["rejected"] == 1 and s["completed"] == n - 1 and np.isinf(r.e2e_s[5])


def test_chunked_prefill_of_long_prompts(sc) -> None:  # type: ignore[no-untyped-def]
    n = 10
    w = Workload(
        arrival_s=np.zeros(n),
        input_tokens=np.full(n, 6000, dtype=np.int64),
        output_tokens=np.full(n, 10, dtype=np.int64),
        prompt_index=np.full(n, -1, dtype=np.int64),
        rate_rps=10.0,
        duration_s=1.0,
    )
    small_chunks = simulate(_plan([{**SMALL_4090, "gpu": "h100-sxm"}]), sc, w, chunk_tokens=2048).summary()
    assert small_chunks["completed"] == n
    # the first request's first token needs ceil(6000 / 2048) = 3 prefill iterations
    r = simulate(_plan([{**SMALL_4090, "gpu": "h100-sxm"}]), sc, w, chunk_tokens=2048)
    tm = build_timing(replica_perf(sc.catalog.model("llama-3.1-8b"), sc.catalog.gpu("h100-sxm")), chunk=2048)
    assert r.ttft_s[0] >= 2 * tm.prefill(2048, 2048**2)


def test_linearised_step_times_match_the_perf_model(sc) -> None:  # type: ignore[no-untyped-def]
    cat = sc.catalog
    for model, gpu, tp in (
        ("llama-3.1-8b", "rtx-4090", 1),
        ("llama-3.1-70b", "h100-sxm", 4),
        ("mixtral-8x7b", "h100-sxm", 2),
    ):
        if model not in cat.models:
            continue
        perf = replica_perf(cat.model(model), cat.gpu(gpu), tp=tp)
        tm = build_timing(perf)
        assert tm.max_rel_error < 1e-3
        for b, c, k in ((1, 500.0, 300), (64, 64 * 700.0, 200), (512, 512 * 300.0, 50)):
            exact = float(np.sum(perf.decode_step_time(b, c + b * np.arange(k))))
            assert tm.decode(b, c, k) == pytest.approx(exact, rel=1e-3)
            cum = np.cumsum(perf.decode_step_time(b, c + b * np.arange(k)))
            assert tm.steps_within(b, c, float(cum[k // 2]) * 0.999) == k // 2 + 1


def test_a_prefill_pass_pays_each_prompts_sequence_cost(sc) -> None:  # type: ignore[no-untyped-def]
    """The tabulated prefill holds one prompt's per-sequence cost and adds the others' exactly, so a pass
    of several prompts costs what the performance model says for that many prompts."""
    perf = replica_perf(sc.catalog.model("llama-3.1-8b"), sc.catalog.gpu("h100-sxm"))
    tm = build_timing(perf, chunk=2048)
    for prompts, length in ((1, 2048), (4, 512), (16, 128)):
        tokens, sq = prompts * length, prompts * float(length) ** 2
        want = float(perf.prefill_time(tokens, sq, prompts=prompts))
        assert tm.prefill(tokens, sq, prompts) == pytest.approx(want, rel=1e-3)


def test_decode_waits_for_the_prompts_that_arrived_during_its_own_prefill(sc) -> None:  # type: ignore[no-untyped-def]
    """The decode-start wait is the busy period of the prefill work that arrived while the request's own
    prompt was prefilled: zero without load, rho x (its prefill iteration) / (1 - rho) with it, growing
    faster than the load. The iteration holds the other prompts batched with it, so it is at least one
    prompt's mean service (issue 27: the per-prompt service alone was 35-40% short of the simulated wait)."""
    from boute.sim.capacity import operating_point, prefill_queue

    tm = build_timing(replica_perf(sc.catalog.model("llama-3.1-8b"), sc.catalog.gpu("rtx-4090")))
    ln = Lengths(4000.0, 4000.0**2, 40.0, 40.0**2)
    assert prefill_queue(tm, 0.0, ln, operating_point(tm, 0.0, ln)).decode_start_wait == 0.0
    waits = []
    for lam in (0.5, 1.0, 1.5):
        q = prefill_queue(tm, lam, ln, operating_point(tm, lam, ln))
        s1 = q.rho / lam  # mean prefill service per prompt
        op = operating_point(tm, lam, ln)
        assert q.decode_start_wait == pytest.approx(q.rho * max(op.prefill_s, s1) / (1.0 - q.rho))
        assert q.decode_start_wait >= q.rho * s1 / (1.0 - q.rho)
        waits.append(q.decode_start_wait)
    assert 0 < waits[0] < waits[1] < waits[2] and waits[2] / waits[1] > 1.5


def test_timing_tables_are_built_once_per_replica_type_and_change_no_simulation(sc) -> None:  # type: ignore[no-untyped-def]
    """The simulator and the fast path share one table per replica type and process (boute.sim.timing_cache):
    two groups of one type get the same table, a search's later simulations reuse it, and a simulation with
    every table rebuilt is the same to the bit as one on tables built for an earlier plan."""
    from boute.sim import timing_cache
    from boute.sim.engine import group_timings

    plan = _plan([SMALL_4090, {**SMALL_4090, "gpu": "rtx-5090"}, {**SMALL_4090, "count": 3}])
    w = build_workload(sc, rate_rps=30, duration_s=20, seed=5)
    timing_cache.clear()
    cold = simulate(plan, sc, w)
    a, b, c = group_timings(plan.deployment, sc, 8192, 2048)
    assert a is c and a is not b  # the type, not the group, keys the table
    assert group_timings(plan.deployment, sc, 4096, 2048)[0] is not a  # nor are other engine limits confused
    warm = simulate(plan, sc, w)
    for field in ("e2e_s", "ttft_s", "tpot_s", "replica", "replica_busy_s"):
        np.testing.assert_array_equal(getattr(cold, field), getattr(warm, field))
    cleared: list[int] = []
    hook = lambda: cleared.append(1)  # noqa: E731
    timing_cache.on_evict(hook)
    try:
        timing_cache.clear()
    finally:
        timing_cache._EVICT_HOOKS.remove(hook)
    assert cleared == [1] and group_timings(plan.deployment, sc, 8192, 2048)[0] is not a


def test_a_full_table_cache_frees_the_tables_and_keeps_the_catalog(  # type: ignore[no-untyped-def]
    sc, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """Past ``MAX_TIMINGS`` the tables are freed (and the caches keyed by their ids, through the hooks), but the
    scenario's catalog stays, so the table built right after the eviction is found again, not rebuilt. With a
    calibration file each catalog lookup of the scenario builds a new catalog (``scenario_catalog``), so a
    cache that dropped its catalogs on eviction would miss every table once more."""
    from boute.catalog.schema import Efficiency
    from boute.perf.calibration import save_calibration, with_calibration
    from boute.sim import timing_cache
    from boute.sim.engine import group_timings

    sc = with_calibration(sc, save_calibration(tmp_path / "cal.yaml", {"rtx-5090": Efficiency(compute=0.5)}))
    plan = _plan([SMALL_4090, {**SMALL_4090, "gpu": "rtx-5090"}])
    timing_cache.clear()
    monkeypatch.setattr(timing_cache, "MAX_TIMINGS", 1)
    cleared: list[int] = []
    hook = lambda: cleared.append(1)  # noqa: E731
    timing_cache.on_evict(hook)
    try:
        a, b = group_timings(plan.deployment, sc, 8192, 2048)  # b's build evicts a
        assert cleared == [1] and len(timing_cache._TIMINGS) == 1
        assert group_timings(plan.deployment[1:], sc, 8192, 2048)[0] is b  # the same catalog: a hit
    finally:
        timing_cache._EVICT_HOOKS.remove(hook)
        timing_cache.clear()
