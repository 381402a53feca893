"""Proposing while evaluating, and a time budget that holds (issue 50 items 1 and 3): ``boute optimize`` as a
user runs it (:func:`bench.bench_optimize_scale._run`: ``make_plan``, MOBO on the simulator with the fast path
as its prior, batches of 4, one worker per core, patience 20, at most 60 evaluations) in three arms, in
interleaved rounds: ``--overlap``; the same pipelined schedule one step after the other (``no_overlap``:
``SearchSettings(overlap=False, pipeline=True)``); and the default schedule (``informed``: each step proposed
with every result before it, nothing overlapped).

``overlap`` and ``no_overlap`` run the same schedule (step k+1 proposed with step k pending,
:mod:`boute.optimize.loop`), so they make the same trials and write the same plan (checked: ``same_plan``);
their wall-time difference is the overlap's alone. ``informed`` against ``overlap`` is what ``--overlap``
gives a user: time and P95 both move, since the proposals differ. Each row also has where the time went
(``phase_s``: ``evaluate`` is the time the search *waited* for
evaluations; ``beside_s``: what the workers evaluated while the strategy proposed) and when the first plan
meeting the targets came (``first_feasible_s``, seconds since the run started, and after how many
evaluations). Then one run per scenario with a ``--time-budget`` a step makes tight (``BUDGETS``): its
search's own seconds (``search_s``: set-up to the last batch, without the confirmation) against the budget;
the goal is within 10%.

Needs a quiet machine: these are wall times. ``python -m bench optimize_overlap`` (3 rounds, built-in and the
480-GPU fleet); ``--quick``: one round of the built-in scenario.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import warnings
from pathlib import Path
from typing import Any

SCENARIOS = ("builtin:paper-gsm8k", "experiments/scenarios/fleet-8x60.yaml")
#: the runs compared: --overlap (the next step proposed beside this one's evaluation), the same schedule one
#: step after the other, and the default schedule (each step proposed with every result before it)
ARMS: dict[str, dict[str, Any]] = {
    "overlap": {"overlap": True},
    "no_overlap": {"overlap": False, "pipeline": True},
    "informed": {},
}
#: a budget under each scenario's default run, so the search is stopped by it (seconds)
BUDGETS = {"builtin:paper-gsm8k": 5.0, "experiments/scenarios/fleet-8x60.yaml": 30.0}


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(vals), 1) if vals else None


def run(quick: bool = True) -> dict[str, Any]:
    from bench.bench_optimize_scale import _run
    from bench.bench_optimize_wall import warm_up
    from boute.specs import load_scenario

    warnings.filterwarnings("ignore")
    rounds = 1 if quick else 3
    out: dict[str, Any] = {"load_avg_start": round(os.getloadavg()[0], 2), "rows": {}}
    for scenario in SCENARIOS[:1] if quick else SCENARIOS:
        warm_up(load_scenario(scenario))
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ARMS}
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            for r in range(rounds):  # interleaved: the machine's load hits every arm alike
                for name, options in ARMS.items():
                    row = _run(scenario, d / f"{name}-{r}" / "plan.json", experiment=f"{name}-{r}", **options)
                    print(f"[optimize_overlap] {scenario} {name} round {r}: {row}", flush=True)
                    runs[name].append(row)
            budget = BUDGETS[scenario]
            cut = _run(scenario, d / "budget" / "plan.json", time_budget_s=budget, experiment="budget")
            print(f"[optimize_overlap] {scenario} --time-budget {budget:g}: {cut}", flush=True)
        same = [*runs["overlap"], *runs["no_overlap"]]
        plans = {(r.get("p95_s"), r.get("cost_per_hour"), r.get("evaluations")) for r in same}
        out["rows"][scenario] = {
            "runs": runs,
            "same_plan": len(plans) == 1,
            "median_wall_s": {k: _median(v, "wall_s") for k, v in runs.items()},
            "median_search_s": {k: _median(v, "search_s") for k, v in runs.items()},
            "median_first_feasible_s": {k: _median(v, "first_feasible_s") for k, v in runs.items()},
            "time_budget": {
                "budget_s": budget,
                "search_s": cut.get("search_s"),
                "over_budget": None if cut.get("search_s") is None else round(cut["search_s"] / budget - 1, 3),
                "run": cut,
            },
        }
    out["load_avg_end"] = round(os.getloadavg()[0], 2)
    return out
