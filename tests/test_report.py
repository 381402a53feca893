"""``boute report`` (issue 52 item 3): an experiment as one self-contained HTML page.

Fast cases: the progress curves and the priced deployment computed from hand-made trial rows (each figure
known in advance), the tracking DB's migration 0005 on a database an older BOute left, and the rendered page
opened offline in headless Chromium, and the report gathered from a real tracking DB holding one problem
searched by two strategies beside another problem. The slow case runs the real commands: a search with
``--report``, ``boute verify --db --report`` on emulated replicas, then the page in Chromium: no console error, no request to the network, the figures equal the plan file's and the
verdict's, and a screenshot written as a test artifact (``$BOUTE_TEST_ARTIFACTS``, default test-artifacts/).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, text

from boute.optimize.evaluators.base import EvalResult
from boute.report.gather import build_report, curve, phases
from boute.report.model import Progress
from boute.report.render import render
from boute.specs.targets import Targets
from tests import browser

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("BOUTE_TEST_ARTIFACTS", ROOT / "test-artifacts"))
TARGETS = Targets(quality_floor=0.7, p95_cap_s=10.0, budget=20.0)
SETTINGS = {"quality_floor": 0.7, "p95_cap_s": 10.0, "budget_per_hour": 20.0, "mode": "preroute"}

needs_browser = pytest.mark.skipif(browser.missing() is not None, reason=str(browser.missing()))


def _row(index: int, status: str, figures: tuple[float, float, float] | None, elapsed: float | None = None):
    """A stored trial: ``figures`` = (quality, P95, $/h), None for a failed or screened one."""
    metrics = None
    if figures is not None:
        q, p, c = figures
        metrics = EvalResult(q, p, 10.0, c, TARGETS.met_by(q, p, c), 0.01, "fast").to_dict()
    group = {"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 1, "tp": 1, "pp": 1, "dtype": "bf16"}
    params = {"x": [0.0], "z": [0.0], "fractions": [1.0, 0.0], "deployment": [group], "cost_per_hour": 2.0}
    return SimpleNamespace(index=index, status=status, params=params, metrics=metrics, error=None, elapsed_s=elapsed)


def _experiment(name: str = "synthetic", strategy: str = "mobo", objective: str | None = None, **settings: Any):
    s = {**SETTINGS, **settings}
    if objective is not None:
        s["objective"] = objective
    return SimpleNamespace(
        id=1, name=name, scenario="s", strategy=strategy, evaluator="fast", seed=0, status="complete",
        settings=s, created_at=None,
    )  # fmt: skip


#: infeasible (P95 over the cap), feasible, screened, feasible but slower, failed, the best, a confirmation
ROWS = [
    _row(0, "complete", (0.75, 12.0, 10.0), 1.0),
    _row(1, "complete", (0.75, 5.0, 15.0), 2.0),
    _row(2, "screened", None, 2.1),
    _row(3, "complete", (0.72, 7.0, 8.0), 3.0),
    _row(4, "failed", None, 4.0),
    _row(5, "complete", (0.71, 3.0, 18.0), 5.5),
    _row(6, "confirmed", (0.71, 1.0, 18.0), 6.0),
]


def test_progress_is_the_best_feasible_plan_after_each_evaluation() -> None:
    """Screened proposals cost no evaluation and confirmations are not the search's: neither is a step; a
    failed evaluation is a step that changes nothing; infeasible plans never count."""
    latency = curve(_experiment(), ROWS, TARGETS, Progress("p95", "", True, True), this=True)
    assert latency.evaluations == (1, 2, 3, 4, 5)
    assert latency.elapsed_s == (1.0, 2.0, 3.0, 4.0, 5.5) and latency.timed
    assert latency.best == (None, 5.0, 5.0, 5.0, 3.0)
    cost = curve(_experiment(), ROWS, TARGETS, Progress("cost", "", True, False), this=True)
    assert cost.best == (None, 15.0, 8.0, 8.0, 8.0)
    hv = curve(_experiment(), ROWS, TARGETS, Progress("hypervolume", "", False, False), this=True)
    # one feasible plan: the box between it and the reference point (floor, -log cap, -budget)
    one = (0.75 - 0.7) * (math.log(10.0) - math.log(5.0)) * (20.0 - 15.0)
    assert hv.best[0] is None and hv.best[1] == pytest.approx(one)
    assert all(b >= a - 1e-12 for a, b in zip(hv.best[1:], hv.best[2:], strict=False))  # never shrinks
    assert hv.best[-1] > hv.best[1]  # the third feasible plan adds a region no other dominates
    untimed = curve(
        _experiment(), [_row(0, "complete", (0.75, 5.0, 15.0))], TARGETS, Progress("p95", "", True, True), this=True
    )
    assert untimed.elapsed_s == (None,) and not untimed.timed


def test_phases_keep_the_clocks_order_with_their_sub_phases() -> None:
    got = phases({"evaluate": 4.0, "setup": 1.0, "propose": 3.0, "propose.fit": 2.0, "propose.pool": 0.5})
    assert [(p.name, p.seconds) for p in got] == [("setup", 1.0), ("propose", 3.0), ("evaluate", 4.0)]
    assert got[1].parts == (("fit", 2.0), ("pool", 0.5))


PLAN = {
    "created_at": "2026-12-07T00:00:00+00:00",
    "routing": {
        "mode": "preroute", "tiers": ["small", "large"], "fractions": [0.7, 0.3], "scorer": "length",
        "reference": "builtin:gsm8k",
    },
    "deployment": [
        {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090", "count": 3, "tp": 1, "pp": 1},
        {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 2, "tp": 4, "pp": 1},
    ],
    "predicted": {
        "quality": 0.7312, "p95_latency_s": 3.217, "p50_latency_s": 1.1, "throughput_rps": 42.5,
        "cost_per_hour": 3 * 0.5 + 2 * 4 * 2.25, "evaluator": "sim", "feasible": True,
    },
    "objective": "latency",
    "scenario_spec": {"cluster": {"gpus": {"rtx-4090": 3, "h100-sxm": 8}, "budget_per_hour": 20, "prices": {"rtx-4090": 0.5, "h100-sxm": 2.25}}},
}  # fmt: skip

VERDICT = {
    "ok": False,
    "checks": [
        {"name": "share small", "promised": 0.7, "measured": 0.71, "tolerance": "+-0.02", "ok": True},
        {"name": "P95 (s)", "promised": 3.217, "measured": 4.5, "tolerance": "+-15%", "ok": False},
    ],
    "measured": {"requests": 120, "failed": 0, "p50_s": 1.2, "p95_s": 4.5},
    "notes": ["a <note> with markup"],
    "rate_rps": 3.0,
    "duration_s": 40.0,
    "gateway": "boute serve --emulate",
}


def _synthetic_report():
    timed = {"phase_s": {"setup": 1.0, "propose": 3.0, "propose.fit": 2.0, "evaluate": 1.5}, "wall_s": 6.5}
    other = _experiment("other", "random")
    return build_report(_experiment(**timed), ROWS, [(other, ROWS[:3])], (PLAN, 5, "plan.json"), VERDICT)


def test_the_deployment_is_priced_as_the_optimiser_prices_it() -> None:
    """Each group costs replicas x TP x PP x its GPU's $/h (the scenario's overrides first): they add up to
    the plan's own $/h."""
    plan = _synthetic_report().plan
    assert plan is not None and plan.prices_from == "the plan's scenario"
    assert [(g.tier, g.count, g.gpus, g.cost_per_hour) for g in plan.groups] == [
        ("small", 3, 3, 1.5),
        ("large", 2, 8, 18.0),
    ]
    assert plan.deployment_cost == pytest.approx(PLAN["predicted"]["cost_per_hour"])
    assert [t.share for t in plan.tiers] == [0.7, 0.3]


def _decimals(shown: str) -> int:
    number = re.search(r"[-\d,]+(?:\.(\d+))?", shown)
    assert number is not None, shown
    return len(number.group(1) or "")


def _number(shown: str) -> float:
    number = re.search(r"-?[\d,]+(?:\.\d+)?", shown)
    assert number is not None, shown
    return float(number.group(0).replace(",", ""))


def _page_figures(page) -> list[dict[str, str]]:
    return page.eval_on_selector_all(
        "[data-figure]",
        "els => els.map(e => ({figure: e.dataset.figure, group: e.dataset.group ?? '', tier: e.dataset.tier ?? '', "
        "value: e.dataset.value ?? '', text: e.textContent}))",
    )


def _check_plan_figures(page, plan: dict[str, Any]) -> None:
    """The page's figures are the plan's: exact in ``data-value``, and shown rounded to what is printed."""
    shown = {f["figure"]: f for f in _page_figures(page) if not f["group"] and not f["tier"]}
    for name in ("quality", "p95_latency_s", "cost_per_hour", "throughput_rps"):
        want = plan["predicted"][name]
        assert float(shown[name]["value"]) == want, name
        text_ = shown[name]["text"]
        assert abs(_number(text_) - want) <= 0.5 * 10 ** -_decimals(text_) + 1e-12 * abs(want), (name, text_)
        assert page.locator(f'b[data-figure="{name}"]').is_visible()
    figures = _page_figures(page)
    for i, g in enumerate(plan["deployment"]):
        drawn = next(f for f in figures if f["figure"] == "replicas" and f["group"] == str(i))
        assert int(drawn["value"]) == g["count"] and drawn["text"].startswith(f"{g['count']} x {g['gpu']}")
        listed = next(f for f in figures if f["figure"] == "count" and f["group"] == str(i))
        assert int(listed["text"]) == g["count"]
    costs = [float(f["value"]) for f in figures if f["figure"] == "group-cost"]
    assert sum(costs) == pytest.approx(plan["predicted"]["cost_per_hour"], rel=1e-9)
    shares = {f["tier"]: float(f["value"]) for f in figures if f["figure"] == "share"}
    fractions = plan["routing"].get("fractions") or plan["predicted"]["tier_shares"]
    assert shares == dict(zip(plan["routing"]["tiers"], fractions, strict=True))


def _check_verdict(page, verdict: dict[str, Any]) -> None:
    rows = page.eval_on_selector_all(
        "[data-check]", "els => els.map(e => [e.dataset.check, e.dataset.promised, e.dataset.measured])"
    )
    want = [[c["name"], repr(c["promised"]), repr(c["measured"])] for c in verdict["checks"]]
    assert rows == want
    state = page.locator("[data-verdict]").get_attribute("data-verdict")
    assert state == ("ok" if verdict["ok"] else "failed")


@needs_browser
@pytest.mark.timeout(120)  # starts the browser
def test_the_page_renders_offline_with_the_plans_figures(tmp_path: Path) -> None:
    page_file = tmp_path / "report.html"
    page_file.write_text(render(_synthetic_report()), encoding="utf-8")
    html = page_file.read_text()
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "a &lt;note&gt; with markup" in html  # text from the DB is escaped
    with browser.offline_page(page_file) as visit:
        _check_plan_figures(visit.page, PLAN)
        _check_verdict(visit.page, VERDICT)
        charts = visit.page.eval_on_selector_all("img.chart", "els => els.map(e => [e.complete, e.naturalWidth])")
        assert len(charts) == 3 and all(done and width > 0 for done, width in charts)  # every chart decoded
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        visit.page.screenshot(path=str(ARTIFACTS / "report-synthetic.png"), full_page=True)
    assert visit.blocked == [] and visit.errors == []
    assert (ARTIFACTS / "report-synthetic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_migration_0005_adds_trial_wall_time_and_verifications_to_an_old_database(tmp_path: Path) -> None:
    """A database an older BOute left (0004) opens: its trials read with no wall time, new ones record it,
    and the migration can be reverted."""
    from boute.tracking import open_store
    from tests.test_tracking import _to_revision

    url = f"sqlite:///{tmp_path / 'old.db'}"
    _to_revision(url, "0004")
    eng = create_engine(url)
    try:
        with eng.begin() as c:
            c.execute(
                text(
                    "INSERT INTO experiments (name, scenario, strategy, evaluator, seed, settings, status, "
                    "created_at, updated_at) VALUES ('old', 's', 'random', 'fast', 0, '{}', 'complete', "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
            c.execute(
                text(
                    'INSERT INTO trials (experiment_id, "index", status, evaluator, params, metrics, wall_s, '
                    "started_at, finished_at) VALUES (1, 0, 'screened', 'screen', '{}', NULL, 0, "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
    finally:
        eng.dispose()
    store = open_store(url)
    try:
        assert "verifications" in inspect(store.engine).get_table_names()
        (old,) = store.trial_rows(1)
        assert old.elapsed_s is None
        store.add_trial(1, {"index": 1, "status": "screened", "evaluator": "screen", "params": {}, "elapsed_s": 2.5})
        assert [r.elapsed_s for r in store.trial_rows(1)] == [None, 2.5]
        store.add_plan(1, 0, {"created_at": "t", "deployment": [{"gpu": "a"}]}, None, None, "p.json")
        plan = store.plan_row_of({"created_at": "t", "deployment": [{"gpu": "a"}], "balance": "extra"})
        assert plan is not None and store.plan_row_of({"created_at": "t", "deployment": []}) is None
        store.add_verification(plan, {"ok": True, "checks": [], "measured": {"p95_s": math.inf}}, {"rate_rps": 3.0})
        (v,) = store.verifications(1)
        assert v.ok and v.verdict["measured"]["p95_s"] is None and v.info == {"rate_rps": 3.0}  # inf stored as NULL
    finally:
        store.close()
    _to_revision(url, "0004", down=True)
    eng = create_engine(url)
    try:
        assert "verifications" not in inspect(eng).get_table_names()
        assert "elapsed_s" not in {c["name"] for c in inspect(eng).get_columns("trials")}
    finally:
        eng.dispose()


def test_the_report_compares_the_same_problems_strategies_and_finds_the_plans_verification(tmp_path: Path) -> None:
    """Gathered from a real tracking DB: the same problem searched by another strategy is drawn beside (another
    problem is not), the latest plan is the one drawn, and its latest verification is the one shown."""
    from boute.report.gather import gather
    from boute.report.publish import record_verification
    from boute.tracking import open_store

    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        ids = {}
        for name, strategy, floor in (("a", "mobo", 0.7), ("b", "random", 0.7), ("c", "random", 0.8)):
            settings = {**SETTINGS, "quality_floor": floor}
            exp, _ = store.open_experiment(
                name, scenario="s", strategy=strategy, evaluator="fast", seed=0, settings=settings
            )
            ids[name] = exp.id
            for r in ROWS:
                store.add_trial(exp.id, {**vars(r), "evaluator": "fast", "wall_s": 0.01})
        store.add_plan(ids["a"], 1, {**PLAN, "created_at": "older"}, None, None, "old.json")
        store.add_plan(ids["a"], 5, PLAN, None, None, "plan.json")
        old = {**VERDICT, "ok": True, "checks": []}
        assert record_verification(store, PLAN, old, {"rate_rps": 1.0}, "plan.json") == ids["a"]
        assert record_verification(store, PLAN, VERDICT, {"rate_rps": 3.0}, "plan.json") == ids["a"]
        assert record_verification(store, {**PLAN, "created_at": "never"}, VERDICT, {}, "x.json") is None
        report = gather(store, "a")
    finally:
        store.close()
    assert [(c.experiment, c.strategy, c.this) for c in report.curves] == [("a", "mobo", True), ("b", "random", False)]
    assert report.curves[1].best == report.curves[0].best  # the same trials, the same progress
    assert report.plan is not None and report.plan.trial == 5 and report.plan.path == "plan.json"
    v = report.verification
    assert v is not None and not v.ok and v.rate_rps == 3.0 and [c.name for c in v.checks] == ["share small", "P95 (s)"]
    assert (report.screened, report.failed, report.confirmations) == (1, 1, 1)
    assert [p.index for p in report.points] == [0, 1, 3, 5] and {p.index for p in report.front} == {1, 3, 5}


def test_a_resumed_experiment_counts_its_wall_time_on(tmp_path: Path, scenario) -> None:
    """Each trial is recorded with the run's elapsed wall time; a resumed run goes on from where the stored
    trials stopped (the time between the runs left out), so progress against wall time stays one line."""
    from boute.optimize.clock import SearchClock
    from boute.optimize.experiment import open_experiment
    from boute.optimize.records import trial_from_row
    from boute.optimize.settings import SearchSettings
    from boute.tracking import open_store

    store = open_store(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        settings = SearchSettings(experiment="resumed")
        first = open_experiment(store, scenario, settings, "random", "fast", clock=SearchClock(resumed_s=0.0))
        for r in ROWS[:2]:
            first.tracked.add_trial(trial_from_row(r))
        exp_id = first.tracked.experiment_id
        stamped = [r.elapsed_s for r in store.trial_rows(exp_id)]
        assert all(e is not None and e >= 0 for e in stamped) and stamped == sorted(stamped)
        clock = SearchClock()
        again = open_experiment(store, scenario, settings, "random", "fast", clock=clock)
        assert len(again.trials) == 2 and clock.resumed_s == max(stamped)
        again.tracked.add_trial(trial_from_row(ROWS[3]))
        assert store.trial_rows(exp_id)[-1].elapsed_s >= max(stamped)
    finally:
        store.close()


def test_a_report_of_a_missing_experiment_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.cli import run_cli

    db = f"sqlite:///{tmp_path / 'empty.db'}"
    res = run_cli(["report", "--db", db, "-o", str(tmp_path / "r.html")], capsys)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "holds no experiment" in res.stderr
    res = run_cli(["report", "nope", "--db", db, "-o", str(tmp_path / "r.html")], capsys)
    assert res.returncode == 2 and "no experiment named or numbered 'nope'" in res.stderr


@needs_browser
@pytest.mark.slow
@pytest.mark.timeout(300)  # a search (its quality model loads in ~15 s), a verify with emulated replicas, a browser
def test_optimize_and_verify_write_a_report_whose_figures_are_the_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from boute.tracking import open_store
    from tests.cli import run_cli

    db = f"sqlite:///{tmp_path / 'b.db'}"
    res = run_cli(
        ["optimize", "--scenario", "builtin:small-live", "--evaluator", "fast", "--max-evals", "10", "--max-confirm",
         "2", "--db", db, "-q", "--experiment", "m", "--out", str(tmp_path / "plan.json"),
         "--report", str(tmp_path / "opt.html")],
        capsys,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert f"report: {tmp_path / 'opt.html'}" in res.stdout and (tmp_path / "opt.html").is_file()
    plan = json.loads((tmp_path / "plan.json").read_text())

    res = run_cli(
        ["verify", "--plan", str(tmp_path / "plan.json"), "--duration", "20", "--speedup", "8", "--json",
         "--db", db, "--report", str(tmp_path / "verified.html")],
        capsys,
    )  # fmt: skip
    assert res.returncode in (0, 1), res.stderr  # 1: a check outside its tolerance is still a verdict
    verdict = json.loads(res.stdout)  # the report's line went to stderr: stdout stays one JSON object
    assert "report written" in res.stderr
    store = open_store(db)
    try:
        exp = store.experiment("m")
        (v,) = store.verifications(exp.id)
        assert v.plan_id == store.plans(exp.id)[-1].id and v.verdict["checks"] == verdict["checks"]
        rows = store.trial_rows(exp.id)
        elapsed = [r.elapsed_s for r in rows]
        assert all(e is not None for e in elapsed) and elapsed == sorted(elapsed)  # in the order recorded
        assert elapsed[-1] <= exp.settings["wall_s"] and "confirm" in exp.settings["phase_s"]
    finally:
        store.close()

    with browser.offline_page(tmp_path / "verified.html") as visit:
        _check_plan_figures(visit.page, plan)
        _check_verdict(visit.page, verdict)
        steps = visit.page.eval_on_selector_all("#progress tbody td:nth-child(4)", "els => els.map(e => e.textContent)")
        assert steps == [str(sum(r.status in ("complete", "failed") for r in rows))]  # one step per evaluation
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        visit.page.screenshot(path=str(ARTIFACTS / "report-small-live.png"), full_page=True)
    assert visit.blocked == [] and visit.errors == []

    res = run_cli(["report", "m", "--db", db, "-o", str(tmp_path / "again.html")], capsys)
    assert res.returncode == 0, res.stderr
    assert 'data-verdict="' in (tmp_path / "again.html").read_text()  # the recorded verdict, found again
