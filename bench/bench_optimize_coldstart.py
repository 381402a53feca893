"""Cold start of a search: what the first seconds of a fresh ``boute optimize`` process deliver.

Every user's search is the first of its process, so the pool's start is paid on every run: worker processes
spawned, their imports, each one's evaluator built. Two figures, each measured in a fresh interpreter
(``sys.executable``, this environment, so ``PYTHONPATH`` picks the code measured):

* ``first_batch_s``: a 2-worker simulator pool on the built-in scenario, from its creation to the answers of
  its first batch of two plans;
* ``evaluations_in_12s``: plans the simulator evaluated in the first 12 s of a MOBO search (the table's
  settings: simulator objective, fast-path prior, batch 4, 2 workers) on the built-in scenario, latency.

Medians of ``reps`` runs, with the code's revision and the load average beside them: on this shared 2-core
machine the figures move with whatever else runs, so a before/after pair is measured alternately under the
same conditions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

POOL = """
import json, time, numpy as np
if __name__ == "__main__":
    from boute.optimize.evaluators.factory import make_evaluator
    from boute.optimize.evaluators.pool import EvaluatorPool
    from boute.optimize.space import Space
    from boute.specs import load_scenario
    sc = load_scenario(None)
    ev = make_evaluator("sim", sc, "preroute", 0)
    sp = Space.build(sc)
    rng = np.random.default_rng(0)
    cands = [sp.decode(rng.uniform(size=sp.dim)) for _ in range(2)]
    t = time.perf_counter()
    with EvaluatorPool(ev, sc, 0, workers=2) as pool:
        pool.map(cands)
        print(json.dumps({"first_batch_s": time.perf_counter() - t}))
"""

SEARCH = """
import json, time, warnings
if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    from boute.optimize import session
    from boute.optimize.evaluators.factory import make_evaluator
    from boute.optimize.settings import SearchSettings
    from boute.specs import load_scenario
    sc = load_scenario("builtin:paper-gsm8k")
    fe = make_evaluator("fast", sc, seed=0)
    se = make_evaluator("sim", sc, seed=0, quality_model=fe.quality_model)
    t = time.perf_counter()
    settings = SearchSettings(strategy="mobo", objective="latency", seed=0, max_evals=100000, patience=None,
        batch=4, workers=2, time_budget_s=12.0)
    out = session.optimize(sc, settings, session.SearchRuntime(evaluator=se, prior=fe))
    print(json.dumps({"evaluations_in_12s": out.evaluations, "wall_s": time.perf_counter() - t}))
"""


def _fresh(code: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _revision() -> str:
    import boute

    root = Path(boute.__file__).resolve().parent.parent
    done = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def run(quick: bool = True) -> dict[str, Any]:
    reps = 2 if quick else 3
    pool = [_fresh(POOL)["first_batch_s"] for _ in range(reps)]
    search = [_fresh(SEARCH)["evaluations_in_12s"] for _ in range(reps)]
    return {
        "revision": _revision(),
        "reps": reps,
        "first_batch_s": [round(v, 2) for v in pool],
        "first_batch_s_median": round(float(np.median(pool)), 2),
        "evaluations_in_12s": search,
        "evaluations_in_12s_median": float(np.median(search)),
        "load_avg": round(os.getloadavg()[0], 2),
    }
