"""Experiment 4, sensitivity: BOute's plan for gsm8k-f87 under -50% / +50% load and shifted lengths.

The plan optimised for the nominal scenario (100 req/s, GSM8K lengths) is simulated, unchanged, under each
shifted condition (rate x0.5 / x1.5; every request length scaled x0.5 / x1.5 via ``Lengths.scale``), then
BOute re-optimises for the shifted condition (warm-started from the nominal search's plans, re-scored
under the new condition, so the deployed plan is among its candidates) and its new plan is simulated too: how far the fixed plan
degrades and what re-planning recovers (the simulator's figures; the same seed and budget throughout).
"""

from __future__ import annotations

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
from experiments.systems import run_boute

NAME = "sensitivity"
SCENARIO = "gsm8k-f87"
CONDITIONS: dict[str, dict[str, float]] = {
    "nominal": {},
    "load x0.5": {"rate": 0.5},
    "load x1.5": {"rate": 1.5},
    "lengths x0.5": {"lengths": 0.5},
    "lengths x1.5": {"lengths": 1.5},
}


def settings(ctx: Context) -> dict[str, Any]:
    return {
        "conditions": ctx.pick(list(CONDITIONS), list(CONDITIONS), ["nominal", "load x1.5"]),
        "max_evals": ctx.pick(40, 20, 7),
        "patience": ctx.pick(20, 8, 2),
        "mobo_options": ctx.pick(None, {"n_init": 10}, {"n_init": 5, "pool_global": 64, "pool_local": 64}),
    }


def shifted(scenario: Any, change: dict[str, float]) -> Any:
    wl = scenario.workload
    upd: dict[str, Any] = {}
    if "rate" in change:
        upd["rate_rps"] = wl.rate_rps * change["rate"]
    if "lengths" in change:
        upd["lengths"] = wl.lengths.model_copy(update={"scale": wl.lengths.scale * change["lengths"]})
    return scenario.model_copy(update={"workload": wl.model_copy(update=upd)}) if upd else scenario


def rescored(trials: list[Any], evs: Evaluators) -> list[Any]:
    """The nominal search's plans re-evaluated under the shifted condition: re-planning starts from what
    is known (the deployed plan among them) instead of from scratch, as an operator's re-planner would. They
    are re-simulated: the simulator is what BOute's search optimises (:meth:`Evaluators.search`)."""
    from dataclasses import replace

    return [replace(t, result=evs.sim(t.candidate)) for t in trials if t.ok]


def run(ctx: Context) -> dict[str, Any]:
    st = settings(ctx)
    base = load(SCENARIO, ctx)
    nominal_evs = Evaluators(base, seed=ctx.seed)
    plan_run = run_boute(
        nominal_evs, ctx, max_evals=st["max_evals"], patience=st["patience"], strategy_options=st["mobo_options"]
    )
    if plan_run.chosen is None:
        raise RuntimeError(f"{SCENARIO}: BOute found no plan meeting the targets at the nominal condition")
    plan = plan_run.chosen
    rows = []
    for cond in st["conditions"]:
        sc = shifted(base, CONDITIONS[cond])
        evs = nominal_evs if cond == "nominal" else Evaluators(sc, seed=ctx.seed)
        fixed = confirm(evs, plan, seed=ctx.seed)
        row: dict[str, Any] = {
            "condition": cond,
            "rate_rps": sc.workload.rate_rps,
            "length_scale": sc.workload.lengths.scale,
            "fixed_p95_s": fixed["p95_latency_s"],
            "fixed_mean_s": fixed["mean_latency_s"],
            "fixed_throughput_rps": fixed["throughput_rps"],
            "fixed_meets": fixed["meets"],
            "fixed_cost_per_hour": plan.cost_per_hour,
        }
        re = (
            plan_run
            if cond == "nominal"
            else run_boute(
                evs,
                ctx,
                max_evals=st["max_evals"],
                patience=st["patience"],
                strategy_options=st["mobo_options"],
                warm=rescored(plan_run.extra["trials"], evs),
            )
        )
        if re.chosen is not None:
            sim = confirm(evs, re.chosen, seed=ctx.seed)
            row.update(
                {
                    "reopt_p95_s": sim["p95_latency_s"],
                    "reopt_mean_s": sim["mean_latency_s"],
                    "reopt_meets": sim["meets"],
                    "reopt_cost_per_hour": re.chosen.cost_per_hour,
                    "reopt_quality": sim["quality"],
                    "reopt_plan": deployment_text(re.chosen.deployment),
                }
            )
        else:
            row["reopt_note"] = "re-optimisation found no plan meeting the targets"
        rows.append(row)
        record(ctx, NAME, f"{SCENARIO} {cond}", "boute", row)
        print(
            f"[{NAME}] {cond}: fixed P95 {row['fixed_p95_s']:.3g} s, re-optimised {row.get('reopt_p95_s')}", flush=True
        )
    out = {
        "experiment": NAME,
        **ctx.stamp(SCENARIO),
        "settings": st,
        "plan": deployment_text(plan.deployment),
        "fractions": list(plan.fractions),
        "p95_cap_s": base.targets.p95_latency_s,
        "rows": rows,
    }
    save_json(ctx, NAME, out)
    write_report(ctx, out)
    return out


def write_report(ctx: Context, out: dict[str, Any]) -> None:
    rows = out["rows"]
    text = [
        f"# Sensitivity ({out['preset']}, {SCENARIO})\n",
        f"Command: `{out['command']}`, seed {out['seed']}.\n",
        f"Nominal plan: {out['plan']} (fractions {', '.join(f'{f:.3f}' for f in out['fractions'])}); "
        f"P95 cap {out['p95_cap_s']} s. All latencies from the event simulator.\n",
        table(
            [
                "condition",
                "req/s",
                "length scale",
                "fixed plan P95 s",
                "fixed meets",
                "re-optimised P95 s",
                "re-optimised meets",
                "re-optimised $/h",
                "re-optimised plan",
            ],
            [
                [
                    r["condition"],
                    r["rate_rps"],
                    r["length_scale"],
                    r["fixed_p95_s"],
                    r["fixed_meets"],
                    r.get("reopt_p95_s"),
                    r.get("reopt_meets"),
                    r.get("reopt_cost_per_hour"),
                    r.get("reopt_plan"),
                ]
                for r in rows
            ],
        ),
    ]
    save_markdown(ctx, NAME, "\n".join(text))
    fig, ax = new_figure(6.4, 3.8)
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [min(r["fixed_p95_s"], 1e3) for r in rows], 0.4, label="nominal plan, unchanged")
    ax.bar([x + 0.2 for x in xs], [min(r.get("reopt_p95_s") or 0, 1e3) for r in rows], 0.4, label="re-optimised")
    ax.axhline(out["p95_cap_s"], ls="--", c="tab:red", lw=1, label="P95 cap")
    ax.set_xticks(list(xs), [r["condition"] for r in rows], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("P95 latency, s (simulator, log)")
    ax.set_title(f"sensitivity of the gsm8k-f87 plan ({out['preset']})", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(ctx, fig, "sensitivity")
