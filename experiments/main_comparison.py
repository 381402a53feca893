"""Experiment 1, the paper's main comparison: BOute against five baselines on GSM8K and MT-Bench floors.

For each scenario (``experiments/scenarios/``: 100 req/s, $30/h, H100 / RTX PRO 6000 / RTX 5090 / RTX 4090
x8) and each system of :mod:`experiments.systems`:

* the plan it deploys at $30/h and 100 req/s: quality, fast-path P95, and the simulator's P95 / mean
  latency (requests routed by the learned router);
* throughput at equal budget and quality: :func:`experiments.metrics.max_rate`;
* $/h to meet the quality floor and the P95 cap: :func:`experiments.metrics.min_budget`.

BOute's gains are ``rate_boute / rate_baseline - 1`` and ``1 - cost_boute / cost_baseline`` per
(scenario, baseline), averaged as in the paper.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments.common import (
    Context,
    Evaluators,
    Timer,
    deployment_text,
    load,
    new_figure,
    record,
    save_figure,
    save_json,
    save_markdown,
    table,
)
from experiments.metrics import confirm, evaluators_for, max_rate, min_budget
from experiments.system_run import SystemRun
from experiments.systems import SYSTEMS, run_boute, runner

NAME = "main_comparison"
SCENARIOS = ("gsm8k-f87", "gsm8k-f91", "mtbench-f81", "mtbench-f83", "mtbench-f85")


def settings(ctx: Context) -> dict[str, Any]:
    return {
        "scenarios": ctx.pick(SCENARIOS, ("gsm8k-f87", "mtbench-f83"), ("mtbench-f83",)),
        "max_evals": ctx.pick(60, 24, 8),
        "patience": ctx.pick(20, 8, 3),
        "mobo_options": ctx.pick(None, {"n_init": 10}, {"n_init": 5, "pool_global": 64, "pool_local": 64}),
        "bisect_evals": ctx.pick(12, 8, 2),
        "bisect_patience": ctx.pick(10, 4, 2),
        "n_random": ctx.pick(400, 80, 15),
        "cascadia_grid": ctx.pick(21, 9, 4),
        "top_k": ctx.pick(3, 2, 1),
        "budget_tol": ctx.pick(1.0, 2.0, 8.0),
        "sim_steps": ctx.pick(8, 4, 2),
    }


def _system_run(system: str, evs: Evaluators, ctx: Context, st: dict[str, Any], scenario: str) -> SystemRun:
    if system == "boute":
        track = f"exp/{NAME}/{scenario}/boute-trials/s{ctx.seed}/{ctx.preset}/{ctx.run_id}"
        return run_boute(
            evs,
            ctx,
            max_evals=st["max_evals"],
            patience=st["patience"],
            strategy_options=st["mobo_options"],
            track=track,
        )
    return runner(system, ctx, st)(evs, None)


def evaluate_system(system: str, evs: Evaluators, ctx: Context, st: dict[str, Any], scenario: str) -> dict[str, Any]:
    """All metrics of one system on one scenario (one table row)."""
    with Timer() as t:
        run = _system_run(system, evs, ctx, st, scenario)
    row: dict[str, Any] = {
        "system": system,
        "mode": run.mode,
        "search": run.note,
        "evals": run.evals,
        "search_wall_s": t.s,
        **{k: v for k, v in run.extra.items() if k != "trials"},
    }
    if run.chosen is not None:
        r = run.chosen_result
        row.update({"search_evaluator": r.evaluator, "search_p95_s": r.p95_latency_s})  # what it chose by
        r = evaluators_for(run, evs).fast_of(run.chosen, r)  # BOute searched with the simulator: the fast path's too
        row.update(
            {
                "quality": r.quality,
                "fast_p95_s": r.p95_latency_s,
                "fast_mean_s": r.mean_latency_s,
                "cost_per_hour": run.chosen.cost_per_hour,
                "fractions": list(run.chosen.fractions),
                "deployment": deployment_text(run.chosen.deployment),
            }
        )
        sim = confirm(evaluators_for(run, evs), run.chosen, seed=ctx.seed)
        row.update({"sim_p95_s": sim["p95_latency_s"], "sim_mean_s": sim["mean_latency_s"], "sim_meets": sim["meets"]})
    else:
        row["note"] = "no plan meets the targets at the nominal budget"
    with Timer() as t:
        rate = max_rate(run, evs, top_k=st["top_k"], sim_steps=st["sim_steps"], seed=ctx.seed)
    row.update(
        {"fast_rate_rps": rate.get("fast_rate_rps"), "sim_rate_rps": rate.get("sim_rate_rps"), "rate_wall_s": t.s}
    )
    if rate.get("deployment") is not None:
        row["rate_plan"] = deployment_text(rate["deployment"])
    with Timer() as t:
        cost = min_budget(runner(system, ctx, st), evs, tol=st["budget_tol"], start=run)
    row.update(
        {
            "min_cost_per_hour": cost.get("cost_per_hour"),
            "min_budget_steps": len(cost["steps"]),
            "cost_wall_s": t.s,
            "cost_note": cost.get("note"),
        }
    )
    if cost.get("plan") is not None:
        plan = cost["plan"]
        row["min_cost_plan"] = deployment_text(plan.deployment)
        ev = evaluators_for(run, evs).at_budget(cost["budget_per_hour"])
        row["min_cost_sim_meets"] = confirm(ev, plan, seed=ctx.seed)["meets"]
    return row


def gains(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """BOute's throughput gain and cost saving against each baseline (None where one side has no figure)."""
    b = rows["boute"]
    out: dict[str, dict[str, float | None]] = {}
    for name, r in rows.items():
        if name == "boute":
            continue
        tb, tr = b.get("sim_rate_rps"), r.get("sim_rate_rps")
        cb, cr = b.get("min_cost_per_hour"), r.get("min_cost_per_hour")
        out[name] = {
            "throughput_gain": (tb / tr - 1) if tb and tr else None,
            "cost_saving": (1 - cb / cr) if cb and cr else None,
        }
    return out


def summarise(scenarios: dict[str, dict[str, Any]]) -> dict[str, Any]:
    tg = [
        g["throughput_gain"]
        for s in scenarios.values()
        for g in s["gains"].values()
        if g["throughput_gain"] is not None
    ]
    cs = [g["cost_saving"] for s in scenarios.values() for g in s["gains"].values() if g["cost_saving"] is not None]
    return {
        "throughput_gain_mean": float(np.mean(tg)) if tg else None,
        "throughput_gain_max": float(np.max(tg)) if tg else None,
        "cost_saving_mean": float(np.mean(cs)) if cs else None,
        "cost_saving_min": float(np.min(cs)) if cs else None,
        "cost_saving_max": float(np.max(cs)) if cs else None,
        "pairs": len(tg),
        "paper": {
            "throughput_gain_mean": 0.59,
            "throughput_gain_max": 1.57,
            "cost_saving_mean": 0.38,
            "cost_saving_range": [0.15, 0.61],
        },
    }


def run(ctx: Context, scenarios: tuple[str, ...] | None = None, systems: tuple[str, ...] = SYSTEMS) -> dict[str, Any]:
    st = settings(ctx)
    out: dict[str, Any] = {"experiment": NAME, **ctx.stamp(), "settings": st, "scenarios": {}}
    for name in scenarios or st["scenarios"]:
        sc = load(name, ctx)
        evs = Evaluators(sc, seed=ctx.seed)
        rows: dict[str, dict[str, Any]] = {}
        for system in systems:
            rows[system] = evaluate_system(system, evs, ctx, st, name)
            record(ctx, NAME, name, system, rows[system])
            print(
                f"[{NAME}] {name} {system}: sim P95 {rows[system].get('sim_p95_s')}, "
                f"rate {rows[system].get('sim_rate_rps')}, min $/h {rows[system].get('min_cost_per_hour')}",
                flush=True,
            )
        out["scenarios"][name] = {
            "description": sc.description,
            "quality_floor": sc.targets.quality_floor,
            "p95_cap_s": sc.targets.p95_latency_s,
            "tier_quality": list(evs.quality_model.tier_quality),
            "rows": rows,
            "gains": gains(rows) if "boute" in rows else {},
        }
    if "boute" in systems:
        out["summary"] = summarise(out["scenarios"])
    save_json(ctx, NAME, out)
    write_report(ctx, out)
    return out


def write_report(ctx: Context, out: dict[str, Any]) -> None:
    parts = [f"# Main comparison ({out['preset']})\n", f"Command: `{out['command']}`, seed {out['seed']}.\n"]
    for name, s in out["scenarios"].items():
        parts.append(f"## {name}: {s['description']}\n")
        parts.append(
            f"Quality floor {s['quality_floor']}, P95 cap {s['p95_cap_s']} s; held-out tier quality "
            f"{', '.join(f'{q:.3f}' for q in s['tier_quality'])}.\n"
        )
        rows = [
            [
                r["system"],
                r.get("quality"),
                r.get("sim_p95_s"),
                r.get("sim_mean_s"),
                r.get("sim_meets"),
                r.get("sim_rate_rps"),
                r.get("fast_rate_rps"),
                r.get("min_cost_per_hour"),
                r.get("deployment"),
            ]
            for r in s["rows"].values()
        ]
        parts.append(
            table(
                [
                    "system",
                    "quality",
                    "P95 s (sim)",
                    "mean s (sim)",
                    "meets (sim)",
                    "max req/s (sim)",
                    "max req/s (fast)",
                    "min $/h",
                    "plan at $30/h",
                ],
                rows,
            )
            + "\n"
        )
        if s["gains"]:
            parts.append(
                table(
                    ["vs baseline", "BOute throughput gain", "BOute cost saving (budget bisection of a P95 search)"],
                    [[k, _pct(g["throughput_gain"]), _pct(g["cost_saving"])] for k, g in s["gains"].items()],
                )
                + "\n"
            )
    if out.get("summary"):
        sm = out["summary"]
        parts.append("## Summary\n")
        parts.append(
            table(
                ["figure", "ours", "paper"],
                [
                    ["throughput gain, mean", _pct(sm["throughput_gain_mean"]), "+59%"],
                    ["throughput gain, max", _pct(sm["throughput_gain_max"]), "+157%"],
                    [
                        "cost saving, mean (budget bisection of a P95 search; the cost experiment measures cost)",
                        _pct(sm["cost_saving_mean"]),
                        "+38%",
                    ],
                ],
            )
            + "\n"
        )
    save_markdown(ctx, NAME, "\n".join(parts))
    plot(ctx, out)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.0%}"


def plot(ctx: Context, out: dict[str, Any]) -> None:
    names = list(out["scenarios"])
    if not names:
        return
    systems = list(next(iter(out["scenarios"].values()))["rows"])
    for metric, label, fname in (
        ("sim_rate_rps", "max req/s meeting P95 cap (sim)", "main_throughput"),
        ("min_cost_per_hour", "$/h to meet targets", "main_cost"),
    ):
        fig, ax = new_figure(7.2, 4.0)
        w = 0.8 / len(systems)
        for i, system in enumerate(systems):
            vals = [out["scenarios"][n]["rows"][system].get(metric) or 0.0 for n in names]
            ax.bar(np.arange(len(names)) + i * w, vals, w, label=system)
        ax.set_xticks(np.arange(len(names)) + 0.4 - w / 2, names, fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(f"{label}: 0 = not reached ({out['preset']})", fontsize=9)
        ax.legend(fontsize=7, ncol=2)
        save_figure(ctx, fig, fname)
