"""Sample efficiency of ``latency`` and ``cost`` before and after the screens (issue 12), and the 12-evaluation test.

For each objective on the built-in scenario (fast evaluator): a 2,000-evaluation random search (no screens)
gives the reference optimum (best feasible P95 for ``latency``, least $/h for ``cost``); MOBO then runs
``seeds`` x ``evals`` evaluations *before* (``screen=False``: every proposal evaluated) and *after*
(``screen=True``: routing moved onto the quality floor, plans over the capacity bound skipped). Figures:
evaluations until the best feasible value is within 2% of the reference (screened proposals are not
evaluations and do not count), the gap after ``evals``, and how many candidates each screen removed.
``feasible_after_12``: whether 12 evaluations find a plan meeting the targets, per seed, before and after
(the goal is 5 of 5 seeds after). Wall times are on the shared 2-core machine and are indicative only.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

GOAL_GAP = 0.02
OBJECTIVES = ("latency", "cost")
METRIC = {"latency": "p95_latency_s", "cost": "cost_per_hour"}


def _trace(trials, targets, key: str) -> list[float]:
    """Best feasible value of ``key`` after each *evaluation* (inf while none is feasible)."""
    best, out = np.inf, []
    for t in trials:
        if not t.evaluated:
            continue
        r = t.result
        if t.ok and targets.met_by(r.quality, r.p95_latency_s, r.cost_per_hour):
            best = min(best, getattr(r, key))
        out.append(best)
    return out


def _evals_to(trace: list[float], ref: float) -> int | None:
    for i, v in enumerate(trace):
        if v <= ref * (1 + GOAL_GAP):
            return i + 1
    return None


def _run(sp, ev, objective: str, seed: int, evals: int, screen: bool) -> tuple[list[Any], Any, float]:
    from boute.optimize.loop import run_search
    from boute.optimize.objectives import Objective
    from boute.optimize.screen import Screen
    from boute.optimize.settings import SearchSettings
    from boute.optimize.strategies.factory import make_strategy

    obj = Objective(objective)
    scr = Screen.build(sp, ev.quality_model, ev.mode) if screen else None
    strat = make_strategy("mobo", sp, seed, objective=obj)
    t0 = time.perf_counter()
    trials = run_search(
        sp, ev, strat, SearchSettings(max_evals=evals, objective=objective, batch=1, patience=None), screen=scr
    )
    return trials, scr, time.perf_counter() - t0


def run(quick: bool = False) -> dict[str, Any]:
    import torch

    from boute.optimize.evaluators import FastEvaluator
    from boute.optimize.loop import run_search, targets_of
    from boute.optimize.settings import SearchSettings
    from boute.optimize.space import Space
    from boute.optimize.strategies.factory import make_strategy
    from boute.specs import load_scenario

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    seeds = 3 if quick else 5
    evals = 40 if quick else 60
    ref_evals = 2000
    sc = load_scenario(None)
    sp = Space.build(sc)
    ev = FastEvaluator(sc)
    tg = targets_of(sp)
    out: dict[str, Any] = {
        "scenario": sc.name,
        "evaluator": "fast",
        "seeds": seeds,
        "evals": evals,
        "goal": "within 2% of the 2,000-evaluation random optimum; a feasible plan in 12 evaluations on 5/5 seeds",
        "objectives": {},
    }
    t0 = time.perf_counter()
    ref_trials = run_search(
        sp, ev, make_strategy("random", sp, 12345), SearchSettings(max_evals=ref_evals, batch=1, patience=None)
    )
    ref_wall = time.perf_counter() - t0
    for objective in OBJECTIVES:
        key = METRIC[objective]
        ref = _trace(ref_trials, tg, key)[-1]
        doc: dict[str, Any] = {"metric": key, "reference": {"evals": ref_evals, "best": ref, "wall_s": ref_wall}}
        for variant, screen in (("before", False), ("after", True)):
            rows = []
            for seed in range(seeds):
                trials, scr, wall = _run(sp, ev, objective, seed, evals, screen)
                tr = _trace(trials, tg, key)
                rows.append(
                    {
                        "seed": seed,
                        "evals_to_within_2pct": _evals_to(tr, ref),
                        "best": tr[-1] if np.isfinite(tr[-1]) else None,
                        "gap_to_reference": (tr[-1] / ref - 1) if np.isfinite(tr[-1]) else None,
                        "feasible_after_12": bool(np.isfinite(tr[min(11, len(tr) - 1)])),
                        "screened_trials": sum(not t.evaluated for t in trials),
                        "screens": scr.summary().to_json() if scr is not None else None,
                        "wall_s": round(wall, 1),
                    }
                )
                print(f"[optimize_objectives] {objective} {variant} seed {seed}: {rows[-1]}", flush=True)
            reached = [r["evals_to_within_2pct"] for r in rows]
            doc[variant] = {
                "runs": rows,
                "evals_to_within_2pct": reached,
                "reached": sum(r is not None for r in reached),
                "median_evals_to_within_2pct": float(np.median([r for r in reached if r is not None]))
                if any(r is not None for r in reached)
                else None,
                "feasible_after_12": sum(r["feasible_after_12"] for r in rows),
            }
        out["objectives"][objective] = doc
    return out
