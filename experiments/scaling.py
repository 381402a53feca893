"""Experiment 2, scaling: optimiser wall time and evaluations to converge, 3 to 6 GPU types (24 to 48 GPUs).

Each scenario (``experiments/scenarios/scaling-*.yaml``) is optimised as ``boute optimize`` does by default
(:meth:`experiments.common.Evaluators.search`: MOBO with the simulator as its objective and the fast path as
its GP's prior, batches of 4 on one worker process per core) with the paper's stopping rule (chosen plan
unchanged for ``patience`` evaluations). Reported:
search-space dimension, wall time to the stop, evaluations run, the evaluation at which the final plan was
first found ("evaluations to converge"), the time to that point, and the simulator's check of the plan.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from experiments.common import (
    Context,
    Evaluators,
    deployment_text,
    load,
    new_figure,
    record,
    save_figure,
    save_json,
    save_markdown,
    table,
)
from experiments.metrics import confirm

NAME = "scaling"
SCENARIOS = ("scaling-3x24", "scaling-4x32", "scaling-5x40", "scaling-6x48")


def settings(ctx: Context) -> dict[str, Any]:
    return {
        "scenarios": ctx.pick(SCENARIOS, ("scaling-3x24", "scaling-6x48"), ("scaling-3x24",)),
        "max_evals": ctx.pick(100, 30, 6),
        "patience": ctx.pick(20, 8, 2),
        "mobo_options": ctx.pick(None, {"n_init": 10}, {"n_init": 5, "pool_global": 64, "pool_local": 64}),
    }


def converge_point(trials: list[Any], targets: Any) -> int | None:
    """1-based index of the trial at which the final chosen plan was first chosen (None: never feasible)."""
    from boute.optimize.trials import best_key_trace

    keys = best_key_trace(trials, targets)
    if not keys or keys[-1] is None:
        return None
    first = len(keys)
    while first > 1 and keys[first - 2] == keys[-1]:
        first -= 1
    return first


def run_one(name: str, ctx: Context, st: dict[str, Any]) -> dict[str, Any]:
    from boute.optimize.loop import targets_of
    from boute.optimize.session import optimize
    from boute.optimize.settings import SearchSettings

    sc = load(name, ctx)
    evs = Evaluators(sc, seed=ctx.seed)
    settings = SearchSettings(
        strategy="mobo",
        max_evals=st["max_evals"],
        seed=ctx.seed,
        patience=st["patience"],
        experiment=f"exp/{NAME}/{name}/mobo-trials/s{ctx.seed}/{ctx.preset}/{ctx.run_id}",
        strategy_options=st["mobo_options"],
    )
    # the quality model and the simulator's workload are built before the clock starts; the worker processes
    # and their evaluators are started inside it, as every `boute optimize` starts them
    search = evs.search()
    stamps: list[float] = []
    t0 = time.perf_counter()

    def stamp(t: Any, _: Any) -> None:
        """One stamp per evaluation (screened proposals are not evaluations): converge_point counts them."""
        if t.evaluated:
            stamps.append(time.perf_counter() - t0)

    out = optimize(sc, settings, replace(search, store=ctx.store(), on_trial=stamp))
    wall = time.perf_counter() - t0
    conv = converge_point(out.trials, targets_of(out.space))
    row: dict[str, Any] = {
        "scenario": name,
        "gpu_types": len([g for g, n in sc.cluster.gpus.items() if n > 0]),
        "gpus": sum(sc.cluster.gpus.values()),
        "dim": out.space.dim,
        "evals": out.evaluations,
        "screened": len(out.trials) - out.evaluations,
        "wall_s": wall,
        "eval_wall_s": sum(t.result.wall_s for t in out.trials if t.result is not None),
        "evals_to_converge": conv,
        "wall_to_converge_s": stamps[conv - 1] if conv else None,
        "stopped_by": "patience" if out.evaluations < st["max_evals"] else "max_evals",
    }
    if out.chosen is not None:
        r = evs.fast(out.chosen.candidate)  # the fast path's figure beside the simulator's
        sim = confirm(evs, out.chosen.candidate, seed=ctx.seed)
        row.update(
            {
                "quality": r.quality,
                "fast_p95_s": r.p95_latency_s,
                "sim_p95_s": sim["p95_latency_s"],
                "sim_meets": sim["meets"],
                "cost_per_hour": out.chosen.candidate.cost_per_hour,
                "plan": deployment_text(out.chosen.candidate.deployment),
            }
        )
    return row


def run(ctx: Context) -> dict[str, Any]:
    st = settings(ctx)
    rows = []
    for name in st["scenarios"]:
        row = run_one(name, ctx, st)
        rows.append(row)
        record(ctx, NAME, name, "boute", row, evaluator="sim")
        print(
            f"[{NAME}] {name}: {row['evals']} evals, {row['wall_s']:.1f} s, converged at {row['evals_to_converge']}",
            flush=True,
        )
    out = {
        "experiment": NAME,
        **ctx.stamp(),
        "settings": st,
        "rows": rows,
        "paper": {"scaling-3x24": {"wall_s": 23.5}, "scaling-6x48": {"wall_s": 72.0}},
    }
    save_json(ctx, NAME, out)
    write_report(ctx, out)
    return out


def write_report(ctx: Context, out: dict[str, Any]) -> None:
    rows = out["rows"]
    paper = {k: v["wall_s"] for k, v in out["paper"].items()}
    text = [
        f"# Scaling ({out['preset']})\n",
        f"Command: `{out['command']}`, seed {out['seed']}.\n",
        table(
            [
                "scenario",
                "GPU types",
                "GPUs",
                "dims",
                "evals run",
                "evals to converge",
                "wall s (to stop)",
                "wall s (to converge)",
                "paper wall s",
                "sim P95 s",
                "meets (sim)",
            ],
            [
                [
                    r["scenario"],
                    r["gpu_types"],
                    r["gpus"],
                    r["dim"],
                    r["evals"],
                    r["evals_to_converge"],
                    r["wall_s"],
                    r["wall_to_converge_s"],
                    paper.get(r["scenario"]),
                    r.get("sim_p95_s"),
                    r.get("sim_meets"),
                ]
                for r in rows
            ],
        ),
    ]
    save_markdown(ctx, NAME, "\n".join(text))
    fig, ax = new_figure(6.0, 3.8)
    xs = [r["gpu_types"] for r in rows]
    ax.plot(xs, [r["wall_s"] for r in rows], "o-", label="wall to stop (ours)")
    ax.plot(xs, [r["wall_to_converge_s"] or 0 for r in rows], "s--", label="wall to converge (ours)")
    ax.plot([3, 6], [23.5, 72.0], "k^:", label="paper (converge)")
    ax2 = ax.twinx()
    ax2.bar(xs, [r["evals_to_converge"] or 0 for r in rows], alpha=0.2, color="tab:green", label="evals to converge")
    ax2.set_ylabel("evaluations to converge")
    ax.set_xlabel("GPU types (8 GPUs each)")
    ax.set_ylabel("seconds")
    ax.set_title(f"optimiser scaling ({out['preset']}, shared 2-core CPU)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    save_figure(ctx, fig, "scaling")
