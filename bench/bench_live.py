"""Live evaluation for the optimiser (issue 6 item 5) on the small scenario ``builtin:small-live``.

Goal (issue 6 must-show): ``optimize --evaluator live`` on a small scenario -- evaluations, wall time, and how
far the ``fast`` evaluator's predictions were from live measurements for the same plans. A search runs
with the live evaluator (each candidate deployed as emulated replicas behind a real gateway, a workload
sample replayed over HTTP); every plan it evaluated is also scored by ``fast`` and the errors are reported.

Two runs: the ``boute optimize --evaluator live`` command itself (MOBO, as a user runs it, timed end to end
from the shell, its trials read back from the tracking DB it wrote), and a random-strategy search through
the same evaluator class in this process.

Approximate by construction: live latencies come from emulated backends timed by the same performance
model ``fast`` uses (so this measures the queueing/batching/routing approximations of ``fast``, not the
performance model's error), compressed ``speedup`` times and scaled back. Quick mode: 4 evaluations, 60
requests each; full: 10 evaluations, 150 requests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any


def _compare(trials: list, fast: Any) -> dict[str, Any]:
    """Each live trial beside the fast evaluator's prediction for the same plan, and the error summary."""
    import numpy as np

    rows = []
    for t in trials:
        if t.result is None:
            rows.append({"plan": t.candidate.key(), "status": t.status, "error": t.error})
            continue
        f = fast(t.candidate)
        lv = t.result
        rows.append(
            {
                "plan": t.candidate.key(),
                "live": {
                    "quality": lv.quality,
                    "p95_latency_s": lv.p95_latency_s,
                    "p50_latency_s": lv.p50_latency_s,
                    "failed": lv.extra.failed,
                    "tier_shares": lv.extra.answered_shares,
                    "wall_s": lv.wall_s,
                    "deploy_s": lv.extra.deploy_s,
                },
                "fast": {
                    "quality": f.quality,
                    "p95_latency_s": f.p95_latency_s,
                    "p50_latency_s": f.p50_latency_s,
                    "stable": f.extra.stable,
                },
                "p95_rel_error": (f.p95_latency_s - lv.p95_latency_s) / lv.p95_latency_s,
                "quality_abs_error": f.quality - lv.quality,
            }
        )
    ok = [r for r in rows if "live" in r and r["live"]["failed"] == 0 and r["fast"]["stable"]]
    p95_err = np.abs([r["p95_rel_error"] for r in ok]) if ok else np.array([np.nan])
    q_err = np.abs([r["quality_abs_error"] for r in ok]) if ok else np.array([np.nan])
    return {
        "fast_vs_live_p95_abs_rel_error_median": float(np.median(p95_err)),
        "fast_vs_live_p95_abs_rel_error_max": float(np.max(p95_err)),
        "fast_vs_live_quality_abs_error_median": float(np.median(q_err)),
        "fast_vs_live_quality_abs_error_max": float(np.max(q_err)),
        "compared_plans": len(ok),
        "plans": rows,
    }


def _cli_run(evals: int, *options: str) -> dict[str, Any]:
    """``boute optimize OPTIONS`` on small-live as a subprocess; its trials come back from the DB it wrote.

    The live trials (searched or confirming) are compared with the fast evaluator on the same plans.
    """
    from boute.optimize.evaluators import FastEvaluator
    from boute.optimize.records import trial_from_row
    from boute.specs import load_scenario
    from boute.tracking import open_store

    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/live.db"
        argv = [sys.executable, "-m", "boute", "optimize", "-s", "builtin:small-live", *options]
        argv += ["--max-evals", str(evals), "--db", db, "--out", f"{tmp}/plan.json", "--quiet", "--seed", "0"]
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            return {"command": " ".join(argv[2:]), "exit_code": proc.returncode, "stderr": proc.stderr[-2000:]}
        store = open_store(db)
        try:
            exp = store.experiments()[0]
            trials = [trial_from_row(r) for r in store.trial_rows(exp["id"])]
        finally:
            store.close()
        plan = json.loads(Path(f"{tmp}/plan.json").read_text())
    live = [t for t in trials if t.result is not None and t.result.evaluator == "live"]
    return {
        "command": f"boute optimize -s builtin:small-live {' '.join(options)} --max-evals {evals} --seed 0",
        "trials": len(trials),
        "trials_by_evaluator_and_status": dict(
            Counter(f"{t.result.evaluator if t.result else '-'}/{t.status}" for t in trials)
        ),
        "wall_s": wall,
        "chosen_plan_predicted": plan.get("predicted"),
        **_compare(live, FastEvaluator(load_scenario("builtin:small-live"))),
    }


def run(quick: bool) -> dict:
    from backends.deploy.live_eval import LiveEvaluator
    from boute.optimize.evaluators import FastEvaluator
    from boute.optimize.loop import run_search
    from boute.optimize.settings import SearchSettings
    from boute.optimize.space import Space
    from boute.optimize.strategies.factory import make_strategy
    from boute.specs import load_scenario

    sc = load_scenario("builtin:small-live")
    space = Space.build(sc)
    evals, requests, speedup = (4, 60, 10.0) if quick else (10, 150, 10.0)
    redis_url = os.environ.get("BOUTE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    fast = FastEvaluator(sc)
    t0 = time.perf_counter()
    with LiveEvaluator(sc, redis_url=redis_url, speedup=speedup, max_requests=requests) as live:
        trials = run_search(
            space, live, make_strategy("random", space, seed=1), SearchSettings(max_evals=evals, batch=1, patience=None)
        )
    wall = time.perf_counter() - t0
    return {
        "goal": "optimize --evaluator live on a small scenario: evaluations, wall time, fast-vs-live error",
        "scenario": "builtin:small-live",
        "evaluations": len(trials),
        "requests_per_evaluation": requests,
        "speedup": speedup,
        "wall_s": wall,
        "wall_s_per_evaluation": wall / max(1, len(trials)),
        **_compare(trials, fast),
        "cli_live_search": _cli_run(6 if quick else 12, "--evaluator", "live"),
        "cli_fast_search_live_confirm": _cli_run(20 if quick else 40, "--confirm-with", "live"),
    }
