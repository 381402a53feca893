"""Learned router, policy quality and metrics on the real GSM8K profile (held-out queries).

Embeddings come from the on-disk cache ($BOUTE_CACHE_DIR or ~/.cache/boute): the first run on a machine
embeds the 1,319 GSM8K prompts once (a few minutes on two busy cores), later runs read them back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from boute.errors import SpecError
from boute.quality import load_profile, load_router
from boute.quality.build import build_quality_model
from boute.quality.embed import Embedder
from boute.quality.metrics import evaluate, oracle_curve
from boute.quality.policy_quality import QualityModel
from boute.quality.router import difficulty_levels, train_router

MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
GPT4 = "gpt-4-1106-preview"


@pytest.fixture(scope="session")
def gsm8k():
    return load_profile("builtin:gsm8k")


@pytest.fixture(scope="session")
def gsm8k_emb(gsm8k):
    return Embedder().embed(gsm8k.prompts)


@pytest.fixture(scope="session")
def gsm8k_qm(gsm8k, gsm8k_emb):
    return build_quality_model(gsm8k, [MIXTRAL, GPT4], ["small", "large"])


def _synthetic(n: int = 10_000, tiers: int = 3, seed: int = 0) -> QualityModel:
    rng = np.random.default_rng(seed)
    q = (rng.random((n, tiers)) < np.linspace(0.5, 0.9, tiers)).astype(float)
    test = np.sort(rng.choice(n, n // 3, replace=False))
    v = rng.random((n, tiers - 1))
    return QualityModel(tuple(f"t{i}" for i in range(tiers)), q[test], test, rng.random(n), cascade_scores=lambda: v)


def test_fraction_threshold_round_trip() -> None:
    qm = _synthetic()
    m = len(qm.route_all)
    rng = np.random.default_rng(1)
    for _ in range(50):
        f = rng.dirichlet(np.ones(3))
        back = qm.fractions_for_thresholds(qm.thresholds_for_fractions(f))
        assert np.abs(back - f).max() <= 1.0 / m + 1e-12
    for f in ([1, 0, 0], [0, 0, 1], [0, 1, 0], [0.5, 0, 0.5]):
        np.testing.assert_allclose(qm.fractions_for_thresholds(qm.thresholds_for_fractions(f)), f, atol=1e-12)


def test_a_harder_mix_lowers_quality_moves_thresholds_and_keeps_load_shares() -> None:
    """Re-weighting profile rows to a mix of harder prompts: the same fractions still mean the same load
    shares (the thresholds move up), the quality is the harder traffic's, and the running thresholds under
    the new mix send more to the large tier."""
    from boute.quality.shares import mix_weights, systematic_resample

    rng = np.random.default_rng(3)
    n = 6000
    d = rng.random(n)
    q = np.stack([(rng.random(n) > d).astype(float), (rng.random(n) > 0.3 * d).astype(float)], axis=1)
    test = np.sort(rng.choice(n, n // 2, replace=False))
    base = QualityModel(("small", "large"), q[test], test, d)
    same = base.reweighted(np.ones(n))
    assert same.preroute([0.7, 0.3]).quality == pytest.approx(base.preroute([0.7, 0.3]).quality)
    np.testing.assert_allclose(same.thresholds_for_fractions([0.7, 0.3]), base.thresholds_for_fractions([0.7, 0.3]))
    hard = base.reweighted(mix_weights(d, [0.5], [0.2, 0.8]))  # 80% of traffic from the harder half
    t_base, t_hard = base.thresholds_for_fractions([0.7, 0.3]), hard.thresholds_for_fractions([0.7, 0.3])
    assert t_hard[0] > t_base[0] + 0.1
    assert hard.preroute([0.7, 0.3]).shares[1] == pytest.approx(0.3, abs=0.02)
    assert hard.preroute([0.7, 0.3]).quality < base.preroute([0.7, 0.3]).quality - 0.05
    # the old cut (d > 0.7) under the new mix: 0.8 * 0.3 / 0.5 = 48% of the traffic to the large tier, not 30%
    assert hard.fractions_for_thresholds(t_base)[1] == pytest.approx(0.48, abs=0.01)
    assert np.mean(d[hard.test_index] > 0.5) == pytest.approx(0.8, abs=0.01)
    with pytest.raises(ValueError, match="already re-weighted"):
        hard.reweighted(np.ones(n))
    with pytest.raises(ValueError, match="not all 0"):
        systematic_resample(np.zeros(5), 3)


def test_all_to_one_tier_gets_that_tiers_quality(gsm8k_qm: QualityModel) -> None:
    qm = gsm8k_qm
    for k in range(2):
        f = np.eye(2)[k]
        r = qm.preroute(f)
        assert r.quality == pytest.approx(qm.test_scores[:, k].mean(), abs=1e-12)
        np.testing.assert_array_equal(r.shares, f)
        c = qm.cascade(f)
        assert c.quality == pytest.approx(qm.test_scores[:, k].mean(), abs=1e-12)
    assert qm.cascade([1, 0]).judge_calls == 1.0 and qm.cascade([1, 0]).visits[1] == 0.0
    syn = _synthetic()
    for k in range(3):
        assert syn.preroute(np.eye(3)[k]).quality == pytest.approx(syn.tier_quality[k], abs=1e-12)
        assert syn.cascade(np.eye(3)[k]).quality == pytest.approx(syn.tier_quality[k], abs=1e-12)


def test_oracle_monotone_in_large_share(gsm8k_qm: QualityModel) -> None:
    small, large = gsm8k_qm.test_scores[:, 0], gsm8k_qm.test_scores[:, 1]
    grid = np.linspace(0, 1, 201)
    o = oracle_curve(small, large, grid)
    assert np.all(np.diff(o) >= -1e-15)
    assert o[0] == pytest.approx(small.mean()) and o[-1] >= large.mean()
    # and the oracle is an upper bound of the learned router at every share
    res = evaluate(gsm8k_qm)
    r = res["curves"]["router"]
    assert np.all(np.asarray(r["quality"]) <= np.interp(r["share"], grid, o) + 1e-12)


def test_learned_router_beats_random_on_held_out(gsm8k_qm: QualityModel) -> None:
    res = evaluate(gsm8k_qm, modes=("preroute", "cascade"))
    s = res["summary"]
    assert s["random"]["apgr"] == pytest.approx(0.5, abs=1e-9)
    assert s["router"]["apgr"] > 0.53, s  # RouteLLM's own GSM8K routers: ~0.5-0.6
    assert s["oracle"]["apgr"] > s["router"]["apgr"]
    assert s["cascade"]["apgr"] > 0.5
    assert gsm8k_qm.info["router_test_auc"] > 0.5


def test_policy_shapes_and_extra_work() -> None:
    qm = _synthetic()
    r = qm.preroute([0.2, 0.3, 0.5])
    assert r.shares.sum() == pytest.approx(1.0) and r.judge_calls == 0.0 and len(r.thresholds) == 2
    c = qm.cascade([0.5, 0.3, 0.2])
    np.testing.assert_allclose(c.shares, [0.5, 0.3, 0.2], atol=0.03)
    assert c.visits[0] == 1.0 and c.visits[1] == pytest.approx(1 - c.shares[0])
    assert c.judge_calls == pytest.approx(c.visits[0] + c.visits[1])
    with pytest.raises(ValueError, match="sum to 1"):
        qm.preroute([0.5, 0.2, 0.2])
    with pytest.raises(ValueError, match="3 values"):
        qm.preroute([0.5, 0.5])


def test_policy_evaluation_is_repeatable_on_10k_queries() -> None:
    """A search evaluates thousands of policies on the held-out queries (how fast, well under 1 ms each, is
    measured by ``make bench``, bench_quality): each evaluation is a pure function of the fractions."""
    qm = _synthetic(n=30_000, tiers=2)  # 10k held-out queries
    assert qm.n_test == 10_000
    f = np.array([0.6, 0.4])
    for fn in (qm.preroute, qm.cascade):
        a, b = fn(f), fn(f.tolist())
        assert a.quality == b.quality and np.array_equal(a.shares, b.shares), fn.__name__


def test_assign_follows_fractions(gsm8k_qm: QualityModel) -> None:
    idx = np.concatenate([np.arange(1319), np.full(4000, -1)])
    tiers = gsm8k_qm.assign(idx, [0.7, 0.3])
    known = np.bincount(tiers[:1319], minlength=2) / 1319
    np.testing.assert_allclose(known, [0.7, 0.3], atol=1.5 / 1319)
    drawn = np.bincount(tiers[1319:], minlength=2) / 4000
    np.testing.assert_allclose(drawn, [0.7, 0.3], atol=0.03)
    # the same prompts go to the large tier as the router's thresholds say
    t = gsm8k_qm.thresholds_for_fractions([0.7, 0.3])
    np.testing.assert_array_equal(tiers[:1319], (gsm8k_qm.route_all > t[0]).astype(int))
    casc = gsm8k_qm.assign(np.arange(1319), [0.7, 0.3], mode="cascade")
    np.testing.assert_allclose(np.bincount(casc, minlength=2) / 1319, [0.7, 0.3], atol=1.5 / 1319)


def test_router_save_load_round_trip(gsm8k, gsm8k_emb, tmp_path: Path) -> None:
    router, train, test = train_router(gsm8k, [MIXTRAL, GPT4], gsm8k_emb, seed=3)
    assert len(set(train) & set(test)) == 0 and len(train) + len(test) == 1319
    out = router.save(tmp_path / "r.npz")
    back = load_router(out)
    np.testing.assert_allclose(
        back.score_embeddings(gsm8k_emb, gsm8k.prompts), router.score_embeddings(gsm8k_emb, gsm8k.prompts)
    )
    assert back.metadata["tiers"] == [MIXTRAL, GPT4] and back.metadata["split"]["test_indices"] == test.tolist()
    s = back.score_embeddings(gsm8k_emb, gsm8k.prompts)
    assert s.min() >= 0 and s.max() <= 1
    (tmp_path / "r.npz.json").write_text("{}")
    with pytest.raises(SpecError, match="format"):
        load_router(out)
    (tmp_path / "junk.npz").write_bytes(b"not numpy")
    (tmp_path / "junk.npz.json").write_text('{"format": "boute-router/1"}')
    with pytest.raises(SpecError, match="junk.npz"):
        load_router(tmp_path / "junk.npz")
    with pytest.raises(SpecError, match="not found"):
        load_router(tmp_path / "none.npz")


def test_difficulty_levels_for_n_tiers() -> None:
    s = np.array([[1, 1, 1], [0, 1, 1], [0, 0, 1], [0, 0, 0], [0.2, 0.9, 0.5]])
    np.testing.assert_array_equal(difficulty_levels(s, "relative"), [0, 1, 2, 0, 1])
    np.testing.assert_array_equal(difficulty_levels(s, "absolute"), [0, 1, 2, 2, 1])


def test_embedder_cache(tmp_path: Path) -> None:
    e = Embedder(tmp_path)
    texts = ["How many eggs are left?", "Write a haiku about routers.", ""]
    a = e.embed(texts)
    assert not e.last_stats["cached"]
    np.testing.assert_allclose(np.linalg.norm(a[:2], axis=1), 1.0, atol=2e-3)  # float16 on disk
    b = e.embed(texts)
    assert e.last_stats["cached"]
    np.testing.assert_array_equal(a, b)
    assert len(list((tmp_path / "embeddings").glob("*.npy"))) == 1
    assert float(a[0] @ a[1]) < 0.5  # different topics, different vectors


def test_embedding_leaves_autograd_on(tmp_path: Path) -> None:
    """Running the embedding model must not switch gradients off process-wide: BoTorch's acquisition
    optimiser in the same process needs them (a cold embedding cache once broke every MOBO run after it)."""
    import torch

    Embedder(tmp_path).embed(["Is autograd still on?"], cache=False)
    assert torch.is_grad_enabled()
    x = torch.ones(2, requires_grad=True)
    (x * x).sum().backward()
    assert x.grad is not None


def test_cascade_visits_are_exact_where_the_gateway_rounds_up() -> None:
    """Every query reaches the first tier; a later tier sees the shares that end at it or beyond, summed as
    given (``1 - 0.82`` is 0.18000000000000005, which a ceil'd admission bound would turn into one more)."""
    from boute.quality.shares import cascade_visits

    assert cascade_visits([0.82, 0.18]).tolist() == [1.0, 0.18]
    assert cascade_visits([0.5, 0.3, 0.2]).tolist() == [1.0, 0.5, 0.2]
    np.testing.assert_allclose(cascade_visits([0.1, 0.2, 0.3, 0.4]), [1.0, 0.9, 0.7, 0.4])
