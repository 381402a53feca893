"""Re-planning across the seams: the observed scenario, the warm start from the tracking DB, and
`boute replan` watching a real deployment's gateway through Redis."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from boute.replan.drift import Promise
from boute.replan.observed import observed_scenario
from boute.replan.window import Window
from boute.specs import Plan, load_scenario
from tests.waits import SAFETY_S, until

PLAN = Plan.model_validate(
    {
        "routing": {"tiers": ["small", "large"], "fractions": [0.7, 0.3], "scorer": "length"}
        | {"reference": "builtin:gsm8k"},
        "deployment": [
            {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090", "count": 2},
            {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4},
        ],
    }
)


def _window(rate: float, healthy: dict[str, int], answers: float = 200.0, prompts: float = 300.0) -> Window:
    rng = np.random.default_rng(0)
    return Window(
        span_s=30, requests=int(rate * 30), rate_rps=rate, prompt_chars=rng.normal(prompts, 30, 500),
        answer_tokens=rng.normal(answers, 20, 500), scores=rng.random(500), tier_served={"small": 10},
        tier_failed={}, tier_p95_s={}, p95_s=3.0, healthy=healthy, instances=1,
    )  # fmt: skip


def test_the_observed_scenario_takes_the_rate_the_mix_and_the_healthy_fleet() -> None:
    sc = load_scenario("builtin:small-live")
    promise = Promise(3.0, 5.0, np.full(100, 300.0), np.zeros(0), {"small/rtx-4090/tp1pp1": 2})
    healthy = {"small/rtx-4090/tp1pp1": 0, "large/h100-sxm/tp4pp1": 1}  # every rtx-4090 replica is down
    fired = {"answer_mix", "capacity_lost"}
    obs = observed_scenario(sc, PLAN, _window(5.0, healthy, answers=400), promise, np.full(50, 200.0), fired)
    assert obs.workload.rate_rps == pytest.approx(5.0 * 1.1)
    assert obs.workload.lengths.output_scale == pytest.approx(2.0, rel=0.05)  # answers doubled
    assert obs.workload.lengths.input_scale == 1.0  # no prompt-mix trigger: prompts as planned
    assert obs.cluster.gpus.get("rtx-4090", 0) == sc.cluster.gpus["rtx-4090"] - 2  # the two lost GPUs
    assert "rtx-4090" not in obs.cluster.prices or obs.cluster.gpus.get("rtx-4090", 0) > 0
    obs2 = observed_scenario(sc, PLAN, _window(5.0, healthy), promise, None, fired, rate_rps=7.0)
    assert obs2.workload.rate_rps == pytest.approx(7.7)  # a more recent rate estimate wins


def test_harder_traffic_is_planned_as_a_mix_the_running_cut_and_the_answers_it_explains() -> None:
    """Scores shifted up and answers longer: the observed scenario carries the window's score mix, the
    running plan's thresholds are judged by the load shares they give under it, and only the part of the
    answer shift the mix does not explain goes into ``output_scale``."""
    from boute.quality import quality_model_for
    from boute.replan.observed import running_fractions
    from boute.workload import profile_mean_lengths

    sc = load_scenario("builtin:small-live")
    ref = quality_model_for(sc).route_all
    cut = float(np.quantile(ref, 0.7))
    plan = PLAN.model_copy(
        update={"routing": PLAN.routing.model_copy(update={"scorer": "ladder", "router": "r", "thresholds": [cut]})}
    )
    promise = Promise(3.0, 5.0, np.full(100, 300.0), ref, {})
    rng = np.random.default_rng(1)
    hard = rng.choice(ref[ref > np.quantile(ref, 0.5)], 2000)  # traffic from the harder half only
    w = dataclasses.replace(_window(3.0, {}, answers=300.0), scores=hard)
    obs = observed_scenario(sc, plan, w, promise, np.full(50, 200.0), {"answer_mix"})
    mix = obs.workload.mix
    assert mix is not None and len(mix.shares) == 10 and sum(mix.shares[:5]) == pytest.approx(0.0, abs=0.01)
    base_len, mix_len = profile_mean_lengths(sc), profile_mean_lengths(obs)
    assert base_len is not None and mix_len is not None
    explained = mix_len[1] / base_len[1]
    assert obs.workload.lengths.output_scale == pytest.approx(1.5 / explained, rel=0.05)
    assert running_fractions(plan, sc) == tuple(plan.routing.fractions or ())  # the plan's own mix: as written
    assert running_fractions(plan, obs)[1] > 0.5  # the 70th-percentile cut sends most harder traffic up


def test_a_warm_started_search_resumes_from_rescored_trials(tmp_path: Path) -> None:
    from boute.optimize import session
    from boute.optimize.evaluators import FastEvaluator
    from boute.optimize.settings import SearchSettings
    from boute.replan.warm import seed_experiment, warm_trials
    from boute.tracking import open_store

    sc = load_scenario("builtin:small-live")
    store = open_store(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        first = SearchSettings(max_evals=20, experiment="first", patience=None, batch=1, workers=1)
        session.optimize(sc, first, session.SearchRuntime(evaluator=FastEvaluator(sc), store=store))
        busier = sc.model_copy(update={"workload": sc.workload.model_copy(update={"rate_rps": 5.0})})
        ev = FastEvaluator(busier)
        warm = warm_trials(store, ["first"], busier, ev, limit=10)
        assert 0 < len(warm) <= 10 and len({t.candidate.key() for t in warm}) == len(warm)
        assert all(t.result is not None and t.result.evaluator == "fast" for t in warm)
        # one request for the seeded experiment and the search that resumes it: their records match
        second = SearchSettings(max_evals=len(warm) + 5, experiment="second", evaluator="fast", batch=1, workers=1)
        seed_experiment(store, busier, warm, second)
        out = session.optimize(busier, second, session.SearchRuntime(evaluator=ev, store=store))
        assert out.resumed_trials == len(warm) and len(out.trials) == len(warm) + 5
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.timeout(600)  # an optimisation, a deployment, 45 s of traffic, a re-plan; the waits have their own nets
def test_replan_notices_a_rate_step_through_the_gateway_and_proposes_a_plan(tmp_path: Path, redis_url: str) -> None:
    """A deployment of the small scenario, its gateway pushing what it serves to Redis, `boute replan
    --dry-run` watching: doubling the rate fires `rate_high` with its evidence and records a proposed plan
    sized for the new rate; nothing fired while the rate was the planned one."""
    from boute.serving.loadgen import run as generate
    from boute.tracking import open_store
    from tests.services import free_port

    db = f"sqlite:///{tmp_path / 'b.db'}"
    boute = [sys.executable, "-m", "boute"]
    r = subprocess.run([*boute, "optimize", "-s", "builtin:small-live", "--max-evals", "10", "-q", "--db", db]
                       + ["--experiment", "first", "--out", str(tmp_path / "plan.json")], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    d, prefix = tmp_path / "deploy", f"test-replan-{uuid.uuid4().hex[:8]}"
    r = subprocess.run([*boute, "deploy", "up", str(tmp_path / "plan.json"), "--emulate", "--dir", str(d), "--prefix", prefix,
                        "--redis", redis_url, "--gateway-port", str(free_port()), "--json", "--timeout", "120"],
                       capture_output=True, text=True, env={"BOUTE_OBSERVE_INTERVAL_S": "1", **__import__("os").environ})  # fmt: skip
    assert r.returncode == 0, r.stderr
    url = json.loads(r.stdout)["gateway_url"]
    pilot = subprocess.Popen([*boute, "replan", "--dir", str(d), "--db", db, "--dry-run", "--warm-from", "first",
                              "--interval", "1", "--window", "10", "--sustain", "2", "--min-requests", "15"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        from boute.quality.profiles import load_profile

        steady = np.arange(0, 20, 1 / 3.0)  # the plan's 3 req/s for 20 s, then 9 req/s for 25 s
        step = 20 + np.arange(0, 25, 1 / 9.0)
        send = np.concatenate([steady, step]).tolist()
        prompts = load_profile("builtin:gsm8k").prompts  # the plan's own kind of traffic: only the rate moves
        rows = np.random.default_rng(0).integers(0, len(prompts), len(send))
        bodies = [json.dumps({"model": "boute", "messages": [{"role": "user", "content": prompts[i]}]}) for i in rows]
        import asyncio

        res = asyncio.run(generate({"url": url, "send_at": send, "bodies": bodies, "timeout_s": 60}))
        assert sum(s == 200 for s in res["status"]) == len(send)
        rows: list[dict] = []

        def recorded() -> bool:  # the event: the re-plan (a warm-started optimisation in the pilot) is stored
            nonlocal rows
            store = open_store(db)
            try:
                rows = store.replans(str(d.resolve()))
            finally:
                store.close()
            return bool(rows)

        # the pilot's exit ends the wait too; the bound is a net for its optimisation on a busy machine
        with contextlib.suppress(AssertionError):  # then `rows` stays empty and the check below shows its log
            until(recorded, "a re-plan recorded", timeout=3 * SAFETY_S, interval=1.0, procs=[pilot])
    finally:
        pilot.send_signal(signal.SIGINT)
        log = pilot.communicate(timeout=SAFETY_S)[0]
        subprocess.run([*boute, "deploy", "down", "--dir", str(d)], capture_output=True)
    assert rows, log
    row = rows[0]
    kinds = [t["kind"] for t in row["triggers"]]
    assert kinds == ["rate_high"] and row["status"] == "proposed", (row, log)
    assert "rate_high" in row["detail"]
    fired_at = min(t["at"] for t in row["triggers"]) - res["t0_epoch"]
    assert fired_at > 20, log  # not while the rate was the planned one
    ev = next(t for t in row["triggers"] if t["kind"] == "rate_high")["evidence"]
    assert ev["ratio"] > 1.15 and ev["planned_rps"] == 3.0
    assert row["new_plan"]["scenario_spec"]["workload"]["rate_rps"] > 5.0  # sized for the observed rate
    assert "trigger rate_high" in log
