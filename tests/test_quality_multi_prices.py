"""The multi-model router's arithmetic, on synthetic predictions: prices that give the requested load shares
per tier, and the routing rule argmax_k p_k - lambda_k (issue 31 item 3). Training on real data and serving a
multi plan are in tests/test_quality_multi.py."""

from __future__ import annotations

import numpy as np
import pytest

from boute.quality.multi import prices_for_shares, route


@pytest.mark.parametrize("fractions", [[0.2, 0.5, 0.3], [0.0, 0.6, 0.4], [1.0, 0.0, 0.0], [0.05, 0.05, 0.9]])
def test_prices_give_the_requested_shares(fractions: list[float]) -> None:
    p = np.random.default_rng(1).uniform(size=(999, 3))
    lam = prices_for_shares(p, fractions)
    got = np.bincount(route(p, lam), minlength=3)
    want = np.asarray(fractions) * len(p)
    assert np.abs(got - want).max() <= 1.0, (got, want)
    assert all(np.isinf(lam[k]) for k, f in enumerate(fractions) if f == 0)


@pytest.mark.parametrize("n_tiers", [3, 4, 5])
def test_prices_give_exact_counts_in_a_few_sweeps(n_tiers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random shares (some tiny, as a search proposes) on random predictions: every tier gets exactly its
    count, within a few sweeps. Descending on the first tier's price too (the move of all the others at
    once) is what keeps it from stalling on the dual's kinks: without it some of these took all 200 sweeps."""
    import boute.quality.multi as mm

    sweeps: list[int] = []
    real_route = mm.route

    def counted(p: np.ndarray, lam: np.ndarray) -> np.ndarray:
        sweeps[-1] += 1
        return real_route(p, lam)

    monkeypatch.setattr(mm, "route", counted)
    rng = np.random.default_rng(n_tiers)
    p = rng.beta(2, 2, size=(800, n_tiers))
    for f in rng.dirichlet(np.full(n_tiers, 0.5), size=40):
        sweeps.append(0)
        lam = mm.prices_for_shares(p, f)
        np.testing.assert_array_equal(np.bincount(real_route(p, lam), minlength=n_tiers), mm.share_counts(f, 800))
    assert max(sweeps) <= 12, sweeps


def test_prices_stop_on_prompts_no_price_can_split() -> None:
    """Duplicated prompts (identical predictions) always go to one tier: the descent stops when a sweep no
    longer moves the prices, with each count as near its target as the duplicates allow."""
    rng = np.random.default_rng(3)
    p = np.repeat(rng.uniform(size=(50, 3)), 8, axis=0)  # 50 distinct prompts, 8 copies each
    f = [0.31, 0.33, 0.36]
    lam = prices_for_shares(p, f)
    got = np.bincount(route(p, lam), minlength=3)
    assert got.sum() == 400 and np.abs(got - np.asarray(f) * 400).max() <= 8, got


def test_prices_from_a_nearby_start_route_the_prompts_alike() -> None:
    """The optimiser descends from the last policy's prices; the assignment is the same as from zero."""
    p = np.random.default_rng(4).uniform(size=(700, 4))
    start = prices_for_shares(p, [0.1, 0.2, 0.3, 0.4])
    for f in ([0.12, 0.18, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.5, 0.0, 0.5, 0.0]):
        np.testing.assert_array_equal(route(p, prices_for_shares(p, f, start)), route(p, prices_for_shares(p, f)))


def test_prices_maximise_predicted_correctness_at_fixed_shares() -> None:
    """The routed assignment beats every other assignment with the same per-tier counts (checked against
    the exact optimum of the assignment problem, scipy's linear_sum_assignment on replicated columns)."""
    from scipy.optimize import linear_sum_assignment

    rng = np.random.default_rng(2)
    p = rng.uniform(size=(60, 3))
    f = [0.25, 0.5, 0.25]
    tier = route(p, prices_for_shares(p, f))
    counts = np.bincount(tier, minlength=3)
    cols = np.repeat(np.arange(3), counts)
    rows, c = linear_sum_assignment(-p[:, cols])
    best = p[rows, cols[c]].sum()
    assert p[np.arange(60), tier].sum() >= best - 1e-9


def test_item_response_curves_route_out_of_cost_order() -> None:
    """p_k = sigmoid(a_k + b_k d): a tier whose curve lies below a cheaper one's everywhere is never chosen
    at equal prices, and two crossing curves split the difficulty axis where they cross (easy prompts to the
    steep tier, hard ones to the flat one), whatever the tiers' order."""
    from boute.quality.multi import irt_correctness

    d = np.linspace(0.0, 1.0, 101)
    calib = np.array([[3.0, -6.0], [1.5, -1.0], [1.0, -1.0]])  # 0 and 1 cross at d = 0.3; 2 below 1 at every d
    tier = route(irt_correctness(d, calib), np.zeros(3))
    assert 2 not in tier
    cross = float(d[np.argmax(tier == 1)])
    assert (tier[d < cross] == 0).all() and (tier[d >= cross] == 1).all() and abs(cross - 0.3) < 0.011
