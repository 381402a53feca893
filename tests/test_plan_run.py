"""The typed entry point for making a plan (``boute.optimize.plan_run``) and the re-plan loop that calls it
(``boute.replan.loop``): a re-plan gets a typed result, and a failed one a typed error with its reason."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from boute.errors import BouteError, InfeasibleError, SpecError
from boute.optimize.plan_run import PlanRequest, PlanRun, PlanWorker, make_plan
from boute.optimize.settings import SearchSettings
from boute.replan.drift import Thresholds, Trigger
from boute.replan.loop import DESIRED, Autopilot, Replanned
from boute.replan.window import Window, group_key
from boute.serving.bundle import copy_plan, open_plan
from boute.tracking import open_store

#: a quick search: random proposals on the small scenario scored by the fast path, confirmed by the simulator
SMALL = "builtin:small-live"
QUICK = SearchSettings(strategy="random", evaluator="fast", max_evals=8, patience=None)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[PlanRun, str]:
    """A plan made by the typed entry point, into a deployment folder as ``boute deploy up`` leaves one."""
    d = tmp_path_factory.mktemp("deploy")
    db = f"sqlite:///{d / 'b.db'}"
    run = make_plan(PlanRequest(out=d / DESIRED, scenario=SMALL, db=db, search=replace(QUICK, experiment="first")))
    (d / "config.json").write_text(json.dumps({"redis_url": "redis://127.0.0.1:1/0", "prefix": "test-plan-run"}))
    return run, db


def test_make_plan_returns_the_written_plan_and_what_the_run_did(made: tuple[PlanRun, str]) -> None:
    run, db = made
    assert run.path.is_file() and open_plan(run.path) == run.plan  # the plan as written, bundle paths and all
    assert run.plan.balance is not None and run.plan.scenario_spec is not None
    assert run.plan.predicted is not None and run.plan.predicted.evaluator == "sim"  # confirmed by the simulator
    s = run.summary
    assert s.experiment == "first" and s.evaluations == 8 and s.resumed_trials == 0 and s.objective == "latency"
    assert s.confirmations >= 1 and s.searched is not None and s.searched.evaluator == "fast"
    store = open_store(db)
    try:
        exp = store.experiment("first")
        assert exp is not None and exp.status == "complete"
    finally:
        store.close()


def test_a_request_that_cannot_be_met_is_a_typed_error_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    db = f"sqlite:///{tmp_path / 'b.db'}"
    with pytest.raises(InfeasibleError, match="is above the best tier's quality"):
        make_plan(PlanRequest(out=out, scenario=SMALL, db=db, quality_floor=0.99, search=QUICK))
    with pytest.raises(InfeasibleError, match=r"no plan meets .* P95 <= 0.05 s .*closest:"):
        make_plan(PlanRequest(out=out, scenario=SMALL, db=db, p95_cap=0.05, search=replace(QUICK, confirm=False)))
    assert not out.exists()
    with pytest.raises(BouteError, match="--prefer: picks a plan from the pareto front"):
        PlanRequest(out=out, search=SearchSettings(prefer="cost"))  # refused when it is made
    with pytest.raises(BouteError, match="--quality-floor: 1.5 is not in"):
        PlanRequest(out=out, quality_floor=1.5)
    with pytest.raises(BouteError, match="--max-evals: must be >= 1, got 0"):
        replace(QUICK, max_evals=0)


@pytest.mark.timeout(240)  # a spawned worker imports the optimiser (torch) once, then runs three requests
def test_a_worker_process_answers_with_the_same_typed_results_and_errors(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'b.db'}"
    with PlanWorker() as worker:
        with pytest.raises(InfeasibleError, match="is above the best tier's quality"):
            worker.run(PlanRequest(out=tmp_path / "a.json", scenario=SMALL, db=db, quality_floor=0.99, search=QUICK))
        missing = tmp_path / "nope.yaml"
        with pytest.raises(SpecError) as err:  # rebuilt from its parts on this side
            worker.run(PlanRequest(out=tmp_path / "b.json", scenario=str(missing)))
        assert err.value.file is not None and err.value.file.endswith("nope.yaml")
        run = worker.run(
            PlanRequest(out=tmp_path / "c.json", scenario=SMALL, db=db, search=replace(QUICK, max_evals=4))
        )
    assert isinstance(run, PlanRun) and run.path == tmp_path / "c.json" and run.summary.evaluations == 4
    assert open_plan(run.path) == run.plan


def _window(pilot: Autopilot, rate: float) -> Window:
    """A window of the plan's own kind of traffic at ``rate``, every replica healthy."""
    rng = np.random.default_rng(0)
    p = pilot.detector.promise
    healthy: dict[str, int] = {}
    for g in pilot.plan.deployment:
        key = group_key(g.tier, g.gpu, g.tp, g.pp)
        healthy[key] = healthy.get(key, 0) + g.count
    return Window(
        span_s=30, requests=int(rate * 30), rate_rps=rate, prompt_chars=rng.choice(p.prompt_chars, 500),
        answer_tokens=rng.normal(150, 20, 500), scores=rng.choice(p.scores, 500), tier_served={},
        tier_failed={}, tier_p95_s={}, p95_s=1.0, healthy=healthy, instances=1,
    )  # fmt: skip


def _pilot(d: Path, db: str, **kw: object) -> Autopilot:
    opts: dict = {"dry_run": True, "warm_from": ["first"], "planner": make_plan} | kw
    return Autopilot(
        d, db=db, thresholds=Thresholds(), window_s=30.0, max_evals=4, say=lambda _: None, **opts
    )  # fmt: skip


def test_a_replan_gets_a_typed_result_and_a_failed_one_a_typed_error(made: tuple[PlanRun, str]) -> None:
    run, db = made
    d = run.path.parent
    pilot = _pilot(d, db)
    now = time.time()
    rate = 2.0 * pilot.detector.promise.rate_rps
    fired = [Trigger("rate_high", now, {"ratio": 2.0})]
    got = pilot.replan(_window(pilot, rate), fired, now, rate_rps=rate)
    assert isinstance(got, Replanned) and got.status == "proposed" and got.error is None, got.record.get("detail")
    assert got.run is not None and got.run.path == d / "replan-1" / "plan.json"
    assert got.run.plan.scenario_spec is not None
    assert got.run.plan.scenario_spec["workload"]["rate_rps"] >= rate  # sized for the observed rate
    assert got.record["new_plan"] == got.run.plan.model_dump(mode="json", exclude_none=True)

    # the same re-plan for targets no plan can meet: a typed error with its reason, recorded, nothing written
    pilot.sc = pilot.sc.model_copy(update={"targets": pilot.sc.targets.model_copy(update={"quality_floor": 0.99})})
    got = pilot.replan(_window(pilot, rate), fired, now, rate_rps=rate)
    assert got.status == "infeasible" and isinstance(got.error, InfeasibleError) and got.run is None
    assert got.record["detail"] == str(got.error) and "above the best tier's quality" in str(got.error)
    assert not (d / "replan-2" / "plan.json").exists()
    store = open_store(db)
    try:
        rows = store.replans(str(d))
    finally:
        store.close()
    assert [r["status"] for r in rows] == ["proposed", "infeasible"]
    assert rows[1]["detail"] == str(got.error)


def test_a_rollout_that_fails_is_a_typed_error_and_one_that_succeeds_goes_live(
    made: tuple[PlanRun, str], tmp_path: Path
) -> None:
    run, db = made
    d = tmp_path / "deploy"
    d.mkdir()
    copy_plan(run.path, run.plan, d / DESIRED)
    (d / "config.json").write_text((run.path.parent / "config.json").read_text())

    def refuse(plan: Path) -> None:
        raise BouteError("deploy: not ready after 600s")

    pilot = _pilot(d, db, dry_run=False, roll_out=refuse)
    now = time.time()
    rate = 2.0 * pilot.detector.promise.rate_rps
    fired = [Trigger("rate_high", now, {"ratio": 2.0})]
    got = pilot.replan(_window(pilot, rate), fired, now, rate_rps=rate)
    assert got.status == "failed" and isinstance(got.error, BouteError) and got.run is not None
    assert got.record["detail"] == "rollout failed: deploy: not ready after 600s"

    def deploy(plan: Path) -> None:  # what the controller does: the new plan becomes the desired one
        copy_plan(plan, open_plan(plan), d / DESIRED)

    pilot.roll_out = deploy
    got = pilot.replan(_window(pilot, rate), fired, now, rate_rps=rate)
    assert got.status == "deployed" and got.error is None and got.run is not None
    assert pilot.plan == open_plan(got.run.path)  # the loop now judges against the plan that went live
    assert pilot.warm_from == [got.record["experiment"]]


def test_a_rollout_keeps_the_running_plans_affinity(made: tuple[PlanRun, str], tmp_path: Path) -> None:
    """A user turned prefix affinity on in the running plan (figures of their own): the plan a re-plan writes
    and rolls out carries the same section, so the gateway keeps balancing by it after the rollout."""
    from boute.specs.balancing import Affinity

    run, db = made
    d = tmp_path / "deploy"
    d.mkdir()
    mine = Affinity(block_chars=128, min_match=0.5)
    copy_plan(run.path, run.plan.model_copy(update={"affinity": mine}), d / DESIRED)
    (d / "config.json").write_text((run.path.parent / "config.json").read_text())
    published: list[Path] = []

    def deploy(plan: Path) -> None:  # the controller: the new plan file becomes the desired one
        published.append(plan)
        copy_plan(plan, open_plan(plan), d / DESIRED)

    pilot = _pilot(d, db, dry_run=False, roll_out=deploy)
    assert pilot.plan.affinity == mine
    now = time.time()
    rate = 2.0 * pilot.detector.promise.rate_rps
    got = pilot.replan(_window(pilot, rate), [Trigger("rate_high", now, {"ratio": 2.0})], now, rate_rps=rate)
    assert got.status == "deployed" and got.run is not None, got.record.get("detail")
    assert published == [got.run.path] and open_plan(got.run.path).affinity == mine  # the file rolled out
    assert got.run.plan.affinity == mine and got.record["new_plan"]["affinity"] == mine.model_dump(mode="json")
    assert open_plan(d / DESIRED).affinity == mine and pilot.plan.affinity == mine
