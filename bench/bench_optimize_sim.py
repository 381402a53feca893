"""Sample efficiency with the event simulator in the loop (``sim`` evaluator), built-in scenario.

Each strategy gets the same budget of simulator evaluations; the reference is the best feasible P95 that
any run (including a 300-evaluation random search) found, since a 2,000-evaluation random search with the
simulator would take most of an hour on this machine. Figures are approximate like the simulator.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from bench.bench_optimize import _best_trace


def run(quick: bool = True) -> dict[str, Any]:
    import torch

    from boute.optimize.evaluators.factory import make_evaluator
    from boute.optimize.loop import run_search, targets_of
    from boute.optimize.settings import SearchSettings
    from boute.optimize.space import Space
    from boute.optimize.strategies.factory import make_strategy
    from boute.specs import load_scenario

    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    sc = load_scenario(None)
    ev = make_evaluator("sim", sc)
    sp = Space.build(sc)
    tg = targets_of(sp)
    seeds, evals, ref_evals = (2, 60, 150) if quick else (3, 60, 300)
    t0 = time.perf_counter()
    ref = _best_trace(
        run_search(
            sp, ev, make_strategy("random", sp, 12345), SearchSettings(max_evals=ref_evals, batch=1, patience=None)
        ),
        tg,
    )[-1]
    out: dict[str, Any] = {"scenario": sc.name, "evaluator": "sim", "evals": evals, "strategies": {}}
    traces: dict[str, list[list[float]]] = {}
    for name in ("mobo", "random", "nsga2"):
        walls = []
        for seed in range(seeds):
            t1 = time.perf_counter()
            trials = run_search(
                sp, ev, make_strategy(name, sp, seed), SearchSettings(max_evals=evals, batch=1, patience=None)
            )
            walls.append(round(time.perf_counter() - t1, 1))
            traces.setdefault(name, []).append(_best_trace(trials, tg))
        out["strategies"][name] = {"wall_s_per_run": walls}
    best = min(ref, *(tr[-1] for runs in traces.values() for tr in runs))
    out["reference"] = {
        "random_evals": ref_evals,
        "random_best_p95_s": ref,
        "best_known_p95_s": best,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    for name, runs in traces.items():
        finals = [tr[-1] for tr in runs]
        to2 = [next((i + 1 for i, v in enumerate(tr) if v <= best * 1.02), None) for tr in runs]
        out["strategies"][name].update(
            final_best_p95_s=finals,
            gap_to_best_known=[None if not np.isfinite(f) else round(f / best - 1, 4) for f in finals],
            evals_to_within_2pct_of_best_known=to2,
        )
    return out
