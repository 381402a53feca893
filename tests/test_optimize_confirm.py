"""Confirmation never lets a rejected plan through (issue 13).

``boute optimize`` once wrote a plan its simulator confirmation put at 38.5 s against a 5 s cap (the fast
path had said 3.17 s) and exited 0. Now the confirming evaluator's verdict decides: a plan is written only
if it confirms it; otherwise the search goes on with the confirming evaluator, and if nothing passes the
command exits 2 naming the closest confirmed plan. The logic is exercised through the evaluator protocol
alone (a search evaluator that is optimistic everywhere, a confirming one that rejects everything), and end
to end on a prefill-heavy scenario with the real fast path and simulator.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from boute.optimize.confirm import confirm
from boute.optimize.session import SearchRuntime, optimize
from boute.optimize.settings import SearchSettings
from boute.optimize.status import CONFIRMING, TrialStatus
from boute.specs import load_scenario
from tests.cli import run_cli
from tests.optimize_synthetic import SkewedEvaluator

PREFILL = Path(__file__).parent / "scenarios" / "prefill-heavy.yaml"


@pytest.fixture(scope="module")
def scenario():
    return load_scenario(None)


def _run(scenario, objective: str, confirm_skew: float, budget: int, store=None, prior: bool = False):
    fast = SkewedEvaluator(scenario, "skew-fast", 0, 0.2)
    out = optimize(
        scenario,
        SearchSettings(max_evals=24, objective=objective, seed=3, experiment="c", batch=1, workers=1),
        SearchRuntime(evaluator=fast, store=store),
    )
    assert out.chosen is not None  # the optimistic search is sure it found plans meeting the targets
    checker = SkewedEvaluator(scenario, "truth", 1, confirm_skew)
    return confirm(out, checker, store=store, max_evals=budget, seed=3, prior=fast if prior else None)


@pytest.mark.parametrize(("objective", "prior"), [("latency", False), ("cost", False), ("cost", True)])
def test_a_plan_is_final_only_if_the_confirming_evaluator_accepts_it(
    scenario, objective: str, prior: bool, tmp_path
) -> None:
    from boute.tracking import open_store

    store = open_store(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        out = _run(scenario, objective, 1.0, 16, store, prior)
        tg = scenario.goal
        first = out.confirmations[0]
        assert first.status == TrialStatus.CONFIRMED and first.result.evaluator == "truth"
        if out.final is not None:
            r = out.confirmed[out.final.index]
            assert r.evaluator == "truth" and tg.met_by(r.quality, r.p95_latency_s, r.cost_per_hour)
        first_ok = tg.met_by(first.result.quality, first.result.p95_latency_s, first.result.cost_per_hour)
        searched = [t for t in out.confirmations if t.status == TrialStatus.CONFIRM_SEARCH]
        assert len([t for t in out.confirmations if t.result is not None]) <= 16
        # the search's own answer passes (nothing more to do) or fails: then the search goes on with the
        # confirming evaluator, warm-started from the confirmations
        assert bool(searched) == (not first_ok)
        if objective == "cost":  # the cheapest plan sits at the cap, where a 5x optimistic P95 is fatal
            assert not first_ok and searched
        assert out.final is not None, "no plan the truth accepts"
        rows = store.trial_rows(out.experiment_id)[len(out.trials) :]  # after the searched (and screened) ones
        assert [r.status for r in rows] == [t.status for t in out.confirmations]
        assert {r.evaluator for r in rows if r.status in CONFIRMING} == {"truth"}
    finally:
        store.close()


def test_nothing_confirmed_means_no_final_plan_and_names_the_closest(scenario, tmp_path) -> None:
    from boute.tracking import open_store

    store = open_store(f"sqlite:///{tmp_path / 'd.db'}")
    try:
        out = _run(scenario, "cost", 1e4, 7, store)
        assert out.final is None and out.confirm_closest is not None
        assert sum(t.result is not None for t in out.confirmations) == 7  # the whole budget was tried
        msg = out.unconfirmed_message()
        assert msg.startswith("no plan meets quality >= 0.69 and P95 <= 15 s within $30/h by truth: 7 plans confirmed")
        assert "closest: quality" in msg and "skew-fast: P95" in msg
        assert store.experiment("c").status == "unconfirmed"
    finally:
        store.close()


@pytest.fixture
def skewed_registry():
    """Register the optimistic search evaluator and the rejecting confirming one as the CLI sees them."""
    from boute.optimize.registry import EVALUATORS

    EVALUATORS.register("skew-fast", "tests.optimize_synthetic:optimistic_evaluator", "test: optimistic", 0)
    EVALUATORS.register("skew-strict", "tests.optimize_synthetic:rejecting_evaluator", "test: rejects all", 1)
    yield
    for name in ("skew-fast", "skew-strict"):
        EVALUATORS._entries.pop(name, None)


def test_cli_exits_2_and_writes_nothing_when_the_confirmation_rejects_every_plan(
    skewed_registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.json"
    code, _, err = run_cli(
        [
            "optimize",
            "--evaluator",
            "skew-fast",
            "--confirm-with",
            "skew-strict",
            "--max-evals",
            "16",
            "--max-confirm",
            "6",
            "--db",
            f"sqlite:///{tmp_path / 'e.db'}",
            "-q",
            "--out",
            str(plan),
            "--plot",
            str(tmp_path / "front.png"),
        ],
        capsys,
    )
    assert code == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: no plan meets quality >= 0.69") and "by skew-strict: 6 plans confirmed" in last
    assert "closest: quality" in last and "Traceback" not in err
    assert not plan.exists() and (tmp_path / "front.png").exists()


@pytest.mark.slow
def test_prefill_heavy_scenario_writes_only_a_confirmed_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's scenario, real fast path and simulator: exit 0 with a plan the simulator confirms under the
    cap, or exit 2 naming the closest plan; never a written plan that misses the targets."""
    plan = tmp_path / "plan.json"
    code, out, err = run_cli(
        [
            "optimize",
            "--scenario",
            str(PREFILL),
            "--objective",
            "cost",
            "--max-evals",
            "20",
            "--db",
            f"sqlite:///{tmp_path / 'p.db'}",
            "-q",
            "--out",
            str(plan),
        ],
        capsys,
    )
    if code == 0:
        doc = json.loads(plan.read_text())
        pred = doc["predicted"]
        assert pred["evaluator"] == "sim" and pred["feasible"] is True
        assert pred["p95_latency_s"] <= 5.0 and pred["quality"] >= 0.69 and pred["cost_per_hour"] <= 30 + 1e-6
        assert doc["objective"] == "cost" and "meets targets: False" not in out
    else:
        assert code == 2, err
        assert "closest" in err.strip().splitlines()[-1] and not plan.exists()


@pytest.mark.slow  # a search, then a continued search with the simulator as confirming evaluator (~15-25 s)
def test_the_continued_search_learns_the_search_evaluators_error(scenario) -> None:
    """With the search evaluator as the prior, the continued search's GP models only the confirming
    evaluator's discrepancy from it (here a constant factor of 5 in P95), so it lands on a plan that passes
    at no more cost than without the prior."""
    with_prior = _run(scenario, "cost", 1.0, 16, prior=True)
    without = _run(scenario, "cost", 1.0, 16)
    assert with_prior.final is not None
    cost = with_prior.confirmed[with_prior.final.index].cost_per_hour
    assert without.final is None or cost <= without.confirmed[without.final.index].cost_per_hour + 1e-9
