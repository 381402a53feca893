"""The fast path's expected prefix-cache hits (boute/sim/expected_hits.py): the closed form on hand-built prefix
trees, and the estimate against the simulator's replica caches on drawn plans."""

from __future__ import annotations

import numpy as np
import pytest

from boute.sim.expected_hits import ExpectedHits
from boute.workload.prefixes import Prefixes

I64 = np.int64


def _shared_prompt(n: int) -> tuple[Prefixes, np.ndarray]:
    """``n`` requests, each a 1,000-token system prompt (node 0) and a 10-token question of its own."""
    parent = np.array([-1] + [0] * n, I64)
    tokens = np.array([1000] + [10] * n, I64)
    p = Prefixes(
        parent,
        tokens,
        np.arange(1, n + 1, dtype=I64),
        np.full(n, -1, I64),
        np.arange(n, dtype=I64),
        np.ones(n, I64),
        np.full(n + 1, -1, I64),
    )
    return p, np.full(n, 1010, I64)


def test_a_shared_prompt_hits_after_its_first_request_on_the_replica_that_holds_it() -> None:
    p, inp = _shared_prompt(4)
    eh = ExpectedHits(p, inp, 1)
    route = np.zeros(4, I64)
    # one replica, or affinity: every request after the first finds the system prompt
    assert eh.shares(route, [1], affinity=False, cascade=False)[0] == pytest.approx(3000 / 4040)
    assert eh.shares(route, [5], affinity=True, cascade=False)[0] == pytest.approx(3000 / 4040)
    # least load over 2 replicas: request k (0-based) finds it with 1 - (1/2)^k
    want = 1000 * sum(1 - 0.5**k for k in range(4)) / 4040
    assert eh.shares(route, [2], affinity=False, cascade=False)[0] == pytest.approx(want)
    # no replicas: nothing hits
    assert eh.shares(route, [0], affinity=True, cascade=False)[0] == 0.0


def test_hits_count_only_holders_on_the_same_tier_and_a_cascade_prefills_every_hop() -> None:
    p, inp = _shared_prompt(4)
    eh = ExpectedHits(p, inp, 2)
    split = np.array([0, 1, 0, 1], I64)  # each tier's first request misses, its second hits
    hit, prompt = eh.tokens(split, [1, 1], affinity=True, cascade=False)
    assert prompt.tolist() == [2020, 2020] and hit.tolist() == [1000, 1000]
    # cascade: every request is prefilled on tier 0; those reaching tier 1 there too
    hit, prompt = eh.tokens(split, [1, 1], affinity=True, cascade=True)
    assert prompt.tolist() == [4040, 2020] and hit.tolist() == [3000, 1000]


def _conversation() -> Prefixes:
    """Request 0: question (node 0, 100 tokens); its answer node 1 (300 tokens); request 1: turn 2 (node 2, 20)."""
    return Prefixes(
        np.array([-1, 0, 1], I64),
        np.array([100, 300, 20], I64),
        np.array([0, 2], I64),
        np.array([1, -1], I64),
        np.zeros(2, I64),
        np.array([1, 2], I64),
        np.array([-1, 0, -1], I64),
    )


def test_a_later_turn_finds_its_history_only_on_the_tier_that_answered_it() -> None:
    eh = ExpectedHits(_conversation(), np.array([100, 420], I64), 2)
    hit, _ = eh.tokens(np.array([0, 0], I64), [1, 1], affinity=True, cascade=False)
    assert hit.tolist() == [400, 0]  # question and answer, on the tier that gave the answer
    hit, _ = eh.tokens(np.array([1, 0], I64), [1, 1], affinity=True, cascade=False)
    assert hit.tolist() == [0, 0]  # turn 1 ran on the other tier: neither its question nor its answer is here
    # a cascade: turn 1 answered by tier 1 after tier 0 saw (prefilled) it; turn 2 answered at tier 0 finds
    # the question there but not the answer (tier 1's text)
    hit, _ = eh.tokens(np.array([1, 0], I64), [1, 1], affinity=True, cascade=True)
    assert hit.tolist() == [100, 0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_expected_share_is_near_the_simulators_on_a_drawn_plan(seed: int) -> None:
    from bench.bench_expected_hits import _case

    case = None
    rng = np.random.default_rng(seed)
    while case is None:
        case = _case(rng)
    assert abs(case["fast_cached_share"] - case["sim_cached_share"]) < 0.1, case


def test_the_fast_evaluator_charges_a_cache_friendly_tier_less_prefill() -> None:
    from boute.optimize.evaluators.fast import FastEvaluator
    from boute.optimize.space import Space
    from boute.specs import load_scenario

    sc = load_scenario("builtin:shared-system-prompt")
    fe = FastEvaluator(sc)
    space = Space.build(sc)
    rng = np.random.default_rng(3)
    stable = {"with": 0, "without": 0}
    for _ in range(40):
        cand = space.decode(rng.random(space.dim))
        with_hits = fe(cand)
        hits, fe.hits = fe.hits, None
        without = fe(cand)
        fe.hits = hits
        assert without.extra.cached_token_share is None
        share = with_hits.extra.cached_token_share
        assert share is not None and 0.0 < share < 1.0
        stable["with"] += bool(with_hits.extra.stable)
        stable["without"] += bool(without.extra.stable)
        if without.extra.stable:  # shorter prefill: never slower, and a stable plan stays stable
            assert with_hits.extra.stable and with_hits.p95_latency_s <= without.p95_latency_s + 1e-9
    # charged in full, most plans overload on a 1,000-3,000-token system prompt each request repeats
    assert stable["with"] >= max(3, 2 * stable["without"]), stable


def test_the_simulators_promised_shares_are_those_of_the_stream_it_judged() -> None:
    from boute.optimize.evaluators.sim import SimEvaluator
    from boute.optimize.space import Space
    from boute.specs import load_scenario

    sc = load_scenario("builtin:mtbench-conversations")
    se = SimEvaluator(sc)
    space = Space.build(sc)
    cand = space.decode(np.random.default_rng(0).random(space.dim))
    r = se(cand)
    route = se.quality_model.assign(se.workload.prompt_index, np.asarray(cand.fractions), mode="preroute", seed=se.seed)
    want = np.bincount(route, minlength=len(sc.tiers)) / len(route)
    assert r.extra.tier_shares == pytest.approx(tuple(want))
