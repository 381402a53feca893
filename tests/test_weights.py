"""One definition of capacity and of P95: the gateway balances a plan's replicas by the weights the simulator
used, and the simulator, ``boute verify`` and the re-plan window compute P95 the same way."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from boute.errors import SpecError
from boute.serving import BackendSpec
from boute.serving.bundle import open_plan, write_plan
from boute.serving.weights import REFERENCE_LENGTHS, plan_weights
from boute.sim import simulate
from boute.sim.weights import replica_capacity
from boute.specs import Plan, load_scenario
from boute.specs.io import validate
from boute.stats import quantile
from boute.workload import build_workload
from router.balancer import Balancer
from router.config import Settings

ROOT = Path(__file__).resolve().parents[1]
#: four GPU types over two tiers (RTX 4090 and 5090; RTX PRO 6000 TP2 and H100 TP4)
MIXED = json.loads((ROOT / "examples" / "plan-paper.json").read_text())


def _backends(plan: Plan) -> list[BackendSpec]:
    out = []
    for g in plan.deployment:
        for _ in range(g.count):
            out.append(
                BackendSpec(
                    url=f"http://127.0.0.1:{9000 + len(out)}", tier=g.tier, model=g.model, gpu=g.gpu, tp=g.tp, pp=g.pp
                )
            )
    return out


def _gateway_shares(plan: Plan, backends: list[BackendSpec]) -> dict[str, list[float]]:
    """Each replica's share of its tier's weight in the gateway's balancer, in registry order."""
    bal = Balancer(Settings())
    bal.configure(plan, backends)
    out = {}
    for tier, reps in bal.pools.items():
        total = sum(r.weight for r in reps)
        out[tier] = [r.weight / total for r in reps]
        assert [r.spec for r in reps] == [b for b in backends if b.tier == tier]
    return out


def test_a_mixed_gpu_plans_gateway_weights_are_the_simulators(tmp_path: Path) -> None:
    sc = load_scenario("builtin:paper-gsm8k")
    path = write_plan(Plan.model_validate(MIXED), tmp_path / "plan.json", sc)
    plan = open_plan(path)
    assert plan.balance is not None and len(plan.balance.capacity_rps) == len(plan.deployment)
    # the simulator, on the workload the optimiser's evaluators judge the plan on
    res = simulate(plan, sc, build_workload(sc))
    backends = _backends(plan)
    gateway = _gateway_shares(plan, backends)
    for i, tier in enumerate(res.tiers):
        w = res.replica_weight[res.replica_tier == i]
        np.testing.assert_allclose(gateway[tier], w / w.sum(), rtol=1e-12)
    # the four GPU types do differ: the H100 TP4 replica carries most of the large tier
    assert max(gateway["large"]) > 0.6 and len({round(s, 6) for s in gateway["small"]}) == 2
    # and the figures are the scenario's lengths, not a fixed reference request
    assert plan.balance.lengths != REFERENCE_LENGTHS
    assert plan.balance.lengths.mean_output == pytest.approx(float(build_workload(sc).output_tokens.mean()))


def test_a_plan_without_balance_figures_gets_them_from_the_same_rule(tmp_path: Path) -> None:
    """An older plan: its scenario's workload rebuilt (inline, or the built-in it names) gives the same
    figures a written plan carries; with no workload to rebuild, the same rule under reference lengths."""
    sc = load_scenario("builtin:paper-gsm8k")
    written = open_plan(write_plan(Plan.model_validate(MIXED), tmp_path / "plan.json", sc))
    assert written.balance is not None
    old_inline = written.model_copy(update={"balance": None})
    old_named = Plan.model_validate(MIXED)  # names builtin:paper-gsm8k, carries neither spec nor balance
    assert old_named.scenario == "builtin:paper-gsm8k" and old_named.scenario_spec is None
    for old in (old_inline, old_named):
        w = plan_weights(old, tmp_path)
        assert w.source == "scenario" and w.lengths == written.balance.lengths
        for g, cap in zip(written.deployment, written.balance.capacity_rps, strict=True):
            assert w.of((g.model, g.gpu, g.tp, g.pp, g.dtype)) == pytest.approx(cap, rel=1e-12)
    backends = _backends(written)
    old_shares, shares = _gateway_shares(old_named, backends), _gateway_shares(written, backends)
    for tier, got in old_shares.items():
        np.testing.assert_allclose(got, shares[tier], rtol=1e-12)
    anonymous = Plan.model_validate({k: v for k, v in MIXED.items() if k != "scenario"})
    w = plan_weights(anonymous)
    assert w.source == "reference" and w.lengths == REFERENCE_LENGTHS


def test_hardware_the_plan_does_not_list_is_weighed_under_the_plans_lengths(tmp_path: Path) -> None:
    """A replica of the previous plan during a rolling update: same rule, same lengths as the plan's groups."""
    sc = load_scenario("builtin:paper-gsm8k")
    plan = open_plan(write_plan(Plan.model_validate(MIXED), tmp_path / "plan.json", sc))
    assert plan.balance is not None
    extra = BackendSpec(url="http://127.0.0.1:9100", tier="small", model="llama-3.1-8b", gpu="h100-sxm")
    backends = [*_backends(plan), extra]
    bal = Balancer(Settings())
    bal.configure(plan, backends)
    reps = bal.pools["small"]
    expected = replica_capacity(sc.catalog, ("llama-3.1-8b", "h100-sxm", 1, 1, "bf16"), plan.balance.lengths)
    assert expected is not None
    rtx4090 = plan.balance.capacity_rps[0]  # deployment[0]: the small tier's RTX 4090s
    assert reps[-1].weight / reps[0].weight == pytest.approx(expected / rtx4090, rel=1e-12)


def test_balance_figures_must_match_the_deployment() -> None:
    doc = MIXED | {"balance": {"lengths": REFERENCE_LENGTHS.model_dump(), "capacity_rps": [1.0, 2.0]}}
    with pytest.raises(SpecError, match=r"balance.capacity_rps: needs 4 values \(one per deployment group\), got 2"):
        validate(Plan, doc, "plan.json")


def test_the_percentile_helper_is_the_inverted_empirical_cdf() -> None:
    x = np.arange(1.0, 21.0)  # 1..20
    assert quantile(x, 0.95) == 19.0  # 19 of 20 at or below it; linear interpolation would say 19.05
    assert quantile(x, 0.50) == 10.0
    assert quantile(x[::-1], 0.95) == 19.0  # order does not matter
    assert quantile([3.0], 0.95) == 3.0
    assert math.isnan(quantile([], 0.95))
    with_unfinished = np.array([1.0, 2.0, 3.0, math.inf])  # unfinished requests count as the slowest
    assert quantile(with_unfinished, 0.50) == 2.0  # linear: 2.5
    assert quantile(with_unfinished, 0.75) == 3.0  # linear: inf
    assert quantile(with_unfinished, 0.95) == math.inf


def test_verify_and_the_simulator_give_one_p95_for_the_same_latencies() -> None:
    """The same per-request latencies, as ``boute verify`` measures them and as a simulation returns them."""
    from boute.quality.profiles import load_profile
    from boute.serving.verify import measure
    from boute.sim.result import SimResult

    lat = np.random.default_rng(3).lognormal(0.5, 0.8, 300)
    n = len(lat)
    assert quantile(lat, 0.95) != pytest.approx(float(np.percentile(lat, 95)), rel=1e-6)  # the two ways differ here
    results = {
        "status": [200] * n, "latency_s": lat.tolist(), "tier": ["small"] * n, "text": [""] * n,
        "cpu_s": 0.0, "wall_s": 1.0,
    }  # fmt: skip
    profile = load_profile("builtin:gsm8k")
    m = measure(results, np.zeros(n, dtype=np.int64), profile, {"small": profile.models[0]})
    zeros, ones = np.zeros(n), np.ones(1)
    sim = SimResult(
        arrival_s=np.arange(n, dtype=float), ttft_s=zeros, tpot_s=zeros, e2e_s=lat, tier=np.zeros(n, dtype=np.int64),
        replica=np.zeros(n, dtype=np.int64), rejected=np.zeros(n, dtype=bool), tiers=("small",),
        replica_tier=np.zeros(1, dtype=np.int64), replica_group=np.zeros(1, dtype=np.int64), replica_busy_s=ones,
        replica_served=np.full(1, n), replica_weight=ones, duration_s=float(n), cost_per_hour=1.0, p95_target_s=5.0,
        capped=False, sim_end_s=float(n), wall_s=0.0, timing_error=0.0,
    )  # fmt: skip
    s = sim.summary()
    assert m.p95_s == s["p95_latency_s"] == s["tiers"]["small"]["p95_latency_s"] == quantile(lat, 0.95)
    assert m.p50_s == s["p50_latency_s"]
