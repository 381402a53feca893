"""The multi-model router (issue 31 item 3): prices that give the requested load shares, the routing rule,
and training on a real profile (RouterBench) with knobs that stay load shares per tier."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from boute.quality.multi import prices_for_shares, route

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "routerbench" / "arc_challenge_train.csv"


@pytest.mark.parametrize("fractions", [[0.2, 0.5, 0.3], [0.0, 0.6, 0.4], [1.0, 0.0, 0.0], [0.05, 0.05, 0.9]])
def test_prices_give_the_requested_shares(fractions: list[float]) -> None:
    p = np.random.default_rng(1).uniform(size=(999, 3))
    lam = prices_for_shares(p, fractions)
    got = np.bincount(route(p, lam), minlength=3)
    want = np.asarray(fractions) * len(p)
    assert np.abs(got - want).max() <= 1.5, (got, want)
    assert all(np.isinf(lam[k]) for k, f in enumerate(fractions) if f == 0)


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


@pytest.mark.skipif(not DATA.is_file(), reason="../shared/data/routerbench/ not present")
def test_trained_on_routerbench_routes_by_shares() -> None:
    from boute.quality.build import profile_for, tier_models
    from boute.quality.multi import train_multi_router
    from boute.quality.router import split_indices
    from boute.quality.static_embed import load_static
    from boute.specs.scenario import load_scenario

    sc = load_scenario("builtin:routerbench-4tier")
    profile = profile_for(sc)
    models = tier_models(sc, profile)
    train, test = split_indices(len(profile), 0.3, 0)
    mr = train_multi_router(profile, models, train, load_static())
    p = mr.predict(profile.prompts)
    assert p.shape == (len(profile), 4) and ((p > 0) & (p < 1)).all()
    # predicted correctness tracks the tiers' accuracy on the training rows (Yi-34B highest, Mistral-7B lowest)
    acc = profile.scores[np.ix_(train, [profile.models.index(m) for m in models])].mean(axis=0)
    assert np.argmax(p.mean(axis=0)) == np.argmax(acc) and np.argmin(p.mean(axis=0)) == np.argmin(acc)
    f = [0.2, 0.3, 0.5, 0.0]
    tier = route(p, prices_for_shares(p, f))
    np.testing.assert_allclose(np.bincount(tier, minlength=4) / len(p), f, atol=0.002)
    np.testing.assert_allclose(mr.predict(profile.prompts[:3]), p[:3], atol=1e-9)  # one prompt alone = in a batch
