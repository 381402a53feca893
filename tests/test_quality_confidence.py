"""The lower confidence bound a plan states on its held-out quality (issue 31 item 4): its math, that the
floor can hold on it, and its coverage by resampling (how often the true quality falls below it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t as student_t

from boute.optimize.plan_run import PlanRequest, make_plan
from boute.optimize.settings import SearchSettings
from boute.quality import quality_model_for
from boute.quality.build import profile_for, tier_models
from boute.quality.confidence import lower_bound
from boute.quality.policy_quality import QualityModel
from boute.specs.scenario import load_scenario, with_quality_confidence
from boute.specs.targets import Targets

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "routerbench" / "arc_challenge_train.csv"
needs_data = pytest.mark.skipif(not DATA.is_file(), reason="../shared/data/routerbench/ not present")


def _model(scores: np.ndarray, route: np.ndarray, test: np.ndarray, **kw: object) -> QualityModel:
    return QualityModel(("s", "m", "l"), scores[test], test, route, **kw)  # type: ignore[arg-type]


def test_bound_is_mean_minus_t_times_the_standard_error() -> None:
    rng = np.random.default_rng(3)
    n_all = 500
    scores = rng.uniform(size=(n_all, 3)) ** np.array([1.0, 0.7, 0.5])  # graded, not only 0/1
    route = rng.uniform(size=n_all)
    test = np.sort(rng.choice(n_all, 150, replace=False))
    qm = _model(scores, route, test)
    f = [0.3, 0.5, 0.2]
    r = qm.preroute(f)
    tier = qm.assign(test, f)  # the same rule routes the held-out queries
    y = scores[test, tier]
    assert r.mean == pytest.approx(y.mean(), abs=1e-12) and r.quality == r.mean
    assert r.se == pytest.approx(y.std(ddof=1) / np.sqrt(len(y)), rel=1e-9)
    assert r.bound == pytest.approx(y.mean() - student_t.ppf(0.95, len(y) - 1) * r.se, abs=1e-12)
    held = qm.with_confidence(0.99, "bound").preroute(f)
    assert held.quality == held.bound < r.bound < r.mean and held.level == 0.99
    with pytest.raises(ValueError, match="confidence level"):
        lower_bound(0.5, 0.1, 10, 1.0)


@needs_data
def test_a_scenario_holds_its_floor_on_the_bound() -> None:
    sc = load_scenario("builtin:routerbench-3tier")
    mean_model, bound_model = quality_model_for(sc), quality_model_for(with_quality_confidence(sc, 0.9))
    assert (mean_model.hold, bound_model.hold, bound_model.confidence) == ("mean", "bound", 0.9)
    r, b = mean_model.preroute([0.2, 0.8, 0.0]), bound_model.preroute([0.2, 0.8, 0.0])
    assert r.quality == r.mean == b.mean and b.quality == b.bound < r.mean
    assert b.bound == pytest.approx(lower_bound(r.mean, r.se, mean_model.n_test, 0.9))
    floor = (r.mean + b.bound) / 2  # the mean meets it, the bound does not: the floor holds on the latter
    assert Targets(floor, 1.0, 1.0).met_by(r.quality, 0.1, 1.0) and not Targets(floor, 1.0, 1.0).met_by(
        b.quality, 0.1, 1.0
    )


@needs_data
@pytest.mark.parametrize("fractions", [[0.3, 0.7, 0.0], [0.15, 0.6, 0.25]])
def test_coverage_by_resampling(fractions: list[float]) -> None:
    """Draw held-out sets of the scenario's size from the profile (with replacement: i.i.d. queries from a
    population whose true quality is known, the profile's own mean under the policy), compute the bound on
    each as the quality model does, and count how often the true quality falls below it: ~5% at 0.95."""
    qm = quality_model_for(load_scenario("builtin:routerbench-3tier"))
    n_all, n = len(qm.route_all), qm.n_test
    sc = load_scenario("builtin:routerbench-3tier")
    profile = profile_for(sc)
    scores = profile.scores[:, [profile.models.index(m) for m in tier_models(sc, profile)]]
    everyone = np.arange(n_all)
    truth = float(scores[everyone, qm.assign(everyone, fractions)].mean())
    rng = np.random.default_rng(0)
    draws, below = 600, 0
    for _ in range(draws):
        idx = rng.integers(0, n_all, n)
        r = QualityModel(qm.tiers, scores[idx], idx, qm.route_all).preroute(fractions)
        below += truth < r.bound
    miss = below / draws  # binomial sd at 5%: 0.9 points
    assert 0.025 <= miss <= 0.085, miss


@needs_data
def test_optimize_holds_the_bound_to_the_floor(tmp_path: Path) -> None:
    quick = SearchSettings(strategy="random", evaluator="fast", max_evals=16)
    run = make_plan(
        PlanRequest(
            out=tmp_path / "p.json",
            scenario="builtin:routerbench-3tier",
            db=f"sqlite:///{tmp_path / 'b.db'}",
            quality_confidence=0.95,
            search=quick,
        )
    )
    pred = run.plan.predicted
    assert pred is not None and pred.floor_on == "bound" and pred.quality_confidence == 0.95
    assert pred.quality_bound is not None and pred.quality is not None
    assert pred.quality_bound >= 0.80 - 1e-12 and pred.quality > pred.quality_bound
    assert run.plan.scenario_spec is not None and run.plan.scenario_spec["targets"]["floor_on"] == "bound"
