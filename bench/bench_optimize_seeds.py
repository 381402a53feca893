"""The default search over several seeds of one scenario (issue 50: the 480-GPU fleet's time and P95).

Each seed: ``make_plan`` as ``boute optimize`` runs it (:func:`bench.bench_optimize_scale._run`: MOBO on the
simulator with the fast path as its prior, batches of 4, one worker per core, at most 60 evaluations), timed
end to end, with where the time went (the candidate pool, evaluation) and the load average beside it. One run a
seed: the wall time of a 2-core machine moves with whatever else runs, the P95 does not (a seed's search is a
function of its trials).

``BOUTE_BENCH_SEEDS_SCENARIO`` (default the fleet, ``experiments/scenarios/fleet-8x60.yaml``) and
``BOUTE_BENCH_SEEDS`` (default 3; ``--quick``: 1) say what to run.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any


def run(quick: bool = True) -> dict[str, Any]:
    from bench.bench_optimize_scale import _run, summary_row
    from bench.bench_optimize_wall import warm_up
    from boute.specs import load_scenario

    warnings.filterwarnings("ignore")
    scenario = os.environ.get("BOUTE_BENCH_SEEDS_SCENARIO", "experiments/scenarios/fleet-8x60.yaml")
    seeds = int(os.environ.get("BOUTE_BENCH_SEEDS", "1" if quick else "3"))
    warm_up(load_scenario(scenario))
    rows = []
    for seed in range(seeds):
        with tempfile.TemporaryDirectory() as tmp:
            r = _run(scenario, Path(tmp) / "plan.json", seed=seed)
        row = {"seed": seed, **summary_row(r)}
        print(f"[optimize_seeds] {row}", flush=True)
        rows.append(row)
    return {"scenario": scenario, "rows": rows}
