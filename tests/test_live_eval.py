"""The live evaluator: a candidate deployed as emulated replicas, real HTTP through a real gateway, quality
from the recorded answers that came back (bench/bench_live.py compares it with the fast evaluator)."""

from __future__ import annotations

import numpy as np

from boute.optimize.live import LiveEvaluator
from boute.optimize.space import Space
from boute.specs import load_scenario


def test_live_evaluation_of_one_candidate(redis_url: str) -> None:
    sc = load_scenario("builtin:small-live")
    space = Space.build(sc)
    cand = space.decode(np.full(space.dim, 0.6))
    from boute.quality.profiles import load_profile
    from boute.sim import plan_cost

    tier_q = load_profile("builtin:gsm8k").mean_quality()
    col = {t.name: t.quality_model for t in sc.tiers}
    with LiveEvaluator(sc, redis_url=redis_url, speedup=10, max_requests=60) as live:
        r = live(cand)
        prefix = live._ctl.registry.prefix
        assert r.evaluator == "live" and r.extra["failed"] == 0 and r.extra["requests"] == 60
        assert r.extra["answers_match_profile"] == 1.0  # every answer is the answering tier's recorded one
        assert set(r.extra["tier_shares"]) <= {"small", "large"}
        # quality: what the tiers that answered score on average, up to the noise of 60 samples
        expected = sum(share * tier_q[col[t]] for t, share in r.extra["tier_shares"].items())
        assert abs(r.quality - expected) < 0.15, (r.quality, expected)
        assert r.p50_latency_s is not None and 0 < r.p50_latency_s <= r.p95_latency_s < 100
        assert r.cost_per_hour == plan_cost(list(cand.deployment), sc)
    from backends.deploy.registry import Registry

    assert Registry(redis_url, prefix).entries() == []  # torn down
