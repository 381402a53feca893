"""CPU seconds of MOBO's proposals, by sub-phase, on a search's own trials (issue 50 item 2): robust to load.

Each scenario: one default search (``make_plan``, seed 0, as ``boute optimize`` runs it) stores its trials;
then a fresh MOBO strategy (the fast path as its prior, the search's screens) replays every model step of that
search on the stored trials, in order (so each GP fit is warm-started from the step before, as in the
search), and this process's CPU time (``time.process_time``) of each sub-phase is summed: the GP ``fit``, the
candidate ``pool`` (``build_pool``: the neighbours and samples, each screened and decoded; then the fast-path
prior of each new pool plan) and the ``acquisition``. CPU time of one process is what a change to the step
moves, and unlike wall time it hardly depends on what else runs beside it (it still varies by ~10% on a
loaded machine: compare variants in interleaved runs, min of each).

``python -m bench optimize_step`` (the built-in scenario and the 480-GPU fleet); ``--quick``: the built-in only.
Stored in bench/results/optimize_step.json with the pool's mean size.
"""

from __future__ import annotations

import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

SCENARIOS = ("builtin:paper-gsm8k", "experiments/scenarios/fleet-8x60.yaml")


def _trials(db: str) -> list[Any]:
    from boute.optimize.records import trial_from_row
    from boute.optimize.status import CONFIRMING
    from boute.tracking import open_store

    store = open_store(db)
    try:
        exp = store.experiment(1)
        assert exp is not None
        rows = store.trial_rows(exp.id)
    finally:
        store.close()
    return [trial_from_row(r) for r in rows if r.status not in CONFIRMING]


def replay(scenario: str, trials: list[Any], pipelined: bool = False) -> dict[str, Any]:
    """CPU seconds of each sub-phase of MOBO's model steps on ``trials`` (module doc); ``pipelined``: as a
    search with ``--overlap`` proposed them (each step with the one before it pending)."""
    import boute.optimize.strategies.mobo as mobo
    from boute.optimize.evaluators.factory import make_evaluator
    from boute.optimize.screen import Screen
    from boute.optimize.space import Space
    from boute.optimize.strategies.factory import make_strategy
    from boute.specs import load_scenario

    sc = load_scenario(scenario)
    ev = make_evaluator("sim", sc)
    fast = make_evaluator("fast", sc, quality_model=ev.quality_model, workload=ev.workload)
    space = Space.build(sc)
    strategy = make_strategy("mobo", space, 0, prior=lambda c: fast(c).p95_latency_s)
    strategy.bind(ev)
    strategy.use_screen(Screen.build(space, ev.quality_model, ev.mode, ev.workload))
    built = {"cpu_s": 0.0, "plans": 0}
    build_pool = mobo.build_pool

    def timed_pool(*args: Any, **kw: Any) -> Any:
        t0 = time.process_time()
        pool = build_pool(*args, **kw)
        built["cpu_s"] += time.process_time() - t0
        built["plans"] += len(pool.z)
        return pool

    # the strategy's own split, read on this process's CPU clock instead of the wall clock
    clock_module = mobo.time
    mobo.time = type("CpuTime", (), {"perf_counter": staticmethod(time.process_time)})  # type: ignore[assignment]
    mobo.build_pool = timed_pool
    try:
        steps, evaluated, start = 0, 0, 0
        for i, t in enumerate(trials):
            evaluated += t.evaluated
            nxt = trials[i + 1] if i + 1 < len(trials) else None
            if nxt is not None and nxt.step == t.step:
                continue
            if evaluated >= strategy.n_init:  # the proposal made after this step (pipelined: beside it)
                history = trials[: i + 1]
                if pipelined:
                    history = [*trials[:start], *(u.pending() for u in trials[start : i + 1])]
                strategy._bo_step(history, [u for u in history if u.ok])
                steps += 1
            start = i + 1
    finally:
        mobo.time = clock_module
        mobo.build_pool = build_pool
    s = strategy.clock.seconds
    return {
        "steps": steps,
        "cpu_s": {k.removeprefix("propose."): round(v, 2) for k, v in s.items()},
        "build_pool_cpu_s": round(built["cpu_s"], 2),
        "prior_and_quality_cpu_s": round(s.get("propose.pool", 0.0) - built["cpu_s"], 2),
        "pool_plans_mean": round(built["plans"] / max(1, steps), 1),
    }


def run(quick: bool = True) -> dict[str, Any]:
    from bench.bench_optimize_scale import _run

    warnings.filterwarnings("ignore")
    rows: dict[str, Any] = {}
    for scenario in SCENARIOS[:1] if quick else SCENARIOS:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            search = _run(scenario, d / "plan.json")
            print(f"[optimize_step] {scenario} search {search}", flush=True)
            rows[scenario] = {"search": search, "replay": replay(scenario, _trials(f"sqlite:///{d / 'b.db'}"))}
            print(f"[optimize_step] {scenario} replay {rows[scenario]['replay']}", flush=True)
    return {"load_avg": round(os.getloadavg()[0], 2), "rows": rows}
