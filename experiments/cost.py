"""Experiment 5 (issue 12): serving cost at equal performance, measured three ways.

The paper's headline is "15-61% (38% on average) lower serving cost at the same performance targets". Its
protocol is not fully stated; we run the reading that fits its figures and two stricter ones:

(a) **Paper protocol.** Each baseline's performance at $30/h is its max rate under the P95 cap at the quality
    floor (:func:`experiments.metrics.max_rate`: fast-path bisection, then the simulator's). BOute's
    least budget ``B`` to match it is the cost of the cheapest plan it finds that serves that rate under the
    cap at the floor (``--objective cost`` at that rate, confirmed by the simulator); saving = ``1 - B / 30``.
(b) **Equal effort.** At the same targets every system gets the same number of evaluations (``evals``) to
    find its cheapest plan: BOute's are simulator runs (``boute optimize --objective cost`` as it runs by
    default), each baseline's are fast-path evaluations of its own search followed by at most ``confirm``
    simulator confirmations of its plans meeting the targets, cheapest first (the cost x P95 staircase of
    :mod:`boute.optimize.confirm`); its figure is the cheapest plan the simulator confirms. Targets: each baseline's rate from (a) (BOute vs
    that baseline), and the scenario's own 100 req/s (every system). The budget is only a ceiling here (the
    whole GPU inventory), so a figure above $30/h is reported as it is.
(c) **Throughput per dollar.** Each system's rate at $30/h from (a) over the cost of the plan that sustains
    it, beside BOute's (the matched rate over ``B``), and BOute's own $30/h plan (``--objective latency``).

Systems in each one's routing mode: BOute, 70B alone (one GPU type: per GPU type and config, bisection on
the replica count; mixed pool: random search), RouteLLM-style equal budget per tier (per GPU type and config
of each tier, bisection on the budget), BOute on one GPU type (BOute, cost objective, the evaluations split
over the types), preroute; Cascadia-style (cascade routing, its MILP
in cost mode: least price per accept-share grid point, latency table levels under the cap) and BOute in
cascade mode beside it. Every figure comes from this run; nothing is typed in.
"""

from __future__ import annotations

import time
from typing import Any

from experiments.common import (
    Context,
    deployment_text,
    load,
    record,
    save_json,
)
from experiments.cost_report import goal, summarise, write_report
from experiments.cost_search import Family, confirmed_cost, cost_search, inventory_cost
from experiments.cost_setup import BASELINES, NAME, NOMINAL_BUDGET, SCENARIOS


def settings(ctx: Context) -> dict[str, Any]:
    return {
        "scenarios": ctx.pick(SCENARIOS, ("gsm8k-f87", "mtbench-f83"), ("mtbench-f83",)),
        "evals": ctx.pick(40, 24, 8),  # fast-path evaluations per system and target (equal effort)
        "confirm": ctx.pick(12, 6, 3),  # simulator runs per system and target (BOute: its --max-confirm)
        "rate_evals": ctx.pick(60, 24, 8),  # BOute's $30/h latency run for the rate protocol
        "n_random": ctx.pick(400, 80, 15),  # the baselines' own $30/h searches (as in main_comparison)
        "cascadia_grid": ctx.pick(21, 9, 4),
        "top_k": ctx.pick(3, 2, 1),
        "sim_steps": ctx.pick(8, 4, 2),
    }


# ---- (a) and (c): each system at $30/h -----------------------------------------------------------------
def rate_at_budget(system: str, fam: Family, ctx: Context, st: dict[str, Any]) -> dict[str, Any]:
    """The system's max rate under the cap at the floor with $30/h (sim-confirmed), and that plan's cost."""
    from experiments.metrics import max_rate
    from experiments.system_run import SystemRun
    from experiments.systems import runner

    evs = fam.evs("preroute", None, NOMINAL_BUDGET)
    t0 = time.perf_counter()
    if system == "boute":  # what `boute optimize` does at $30/h: --objective latency, screens on
        from boute.optimize.session import SearchRuntime, optimize
        from boute.optimize.settings import SearchSettings

        settings = SearchSettings(max_evals=st["rate_evals"], seed=ctx.seed, batch=1, workers=1)
        out = optimize(evs.scenario, settings, SearchRuntime(evaluator=evs.fast))
        pool = [(t.candidate, t.result) for t in out.trials if t.ok]
        c = out.chosen
        run = SystemRun("boute", "preroute", c and c.candidate, c and c.result, pool, out.evaluations)
    else:
        run = runner(system, ctx, st)(evs, None)
    r = max_rate(run, evs, top_k=st["top_k"], sim_steps=st["sim_steps"], seed=ctx.seed)
    rate, cost = r.get("sim_rate_rps"), r.get("plan_cost_per_hour")
    sim = r.get("sim") or {}
    return {
        "sim_p95_s": sim.get("p95_latency_s") if rate else None,
        "quality": sim.get("quality") if rate else None,
        "mode": run.mode,
        "sim_rate_rps": rate,
        "fast_rate_rps": r.get("fast_rate_rps"),
        "plan_cost_per_hour": cost,
        "rate_per_dollar": (rate / cost) if rate and cost else None,
        "plan": deployment_text(r["deployment"]) if r.get("deployment") is not None else None,
        "fractions": r.get("fractions"),
        "wall_s": time.perf_counter() - t0,
        "note": r.get("note"),
    }


def _saving(boute: float | None, other: float | None) -> float | None:
    return 1.0 - boute / other if boute and other else None


def run_scenario(name: str, ctx: Context, st: dict[str, Any]) -> dict[str, Any]:
    sc = load(name, ctx)
    fam = Family(sc, ctx.seed)
    doc: dict[str, Any] = {
        "description": sc.description,
        "quality_floor": sc.targets.quality_floor,
        "p95_cap_s": sc.targets.p95_latency_s,
        "rate_rps": sc.workload.rate_rps,
        "inventory_cost_per_hour": inventory_cost(sc),
        "at_30": {},
        "matched": {},
        "nominal": {},
    }
    # (a), (c): every system's rate at $30/h
    for system in ("boute", *BASELINES):
        doc["at_30"][system] = rate_at_budget(system, fam, ctx, st)
        _log(name, f"{system} at $30/h", doc["at_30"][system], ("sim_rate_rps", "plan_cost_per_hour"))
    # (a), (b): at each baseline's rate, BOute's cheapest plan and the baseline's own, equal effort
    for base in BASELINES:
        rate = doc["at_30"][base]["sim_rate_rps"]
        if not rate:
            doc["matched"][base] = {"note": f"{base} meets the cap at the floor at no rate within $30/h"}
            continue
        row: dict[str, Any] = {"rate_rps": rate}
        for system in ("boute", base, *(("boute-cascade",) if base == "cascadia" else ())):
            track = f"exp/{NAME}/{name}/{system}-at-{base}/s{ctx.seed}/{ctx.preset}/{ctx.run_id}"
            found = cost_search(system, fam, rate, ctx, st, track if system.startswith("boute") else None)
            row[system] = confirmed_cost(found, fam, rate, st, ctx)
            if system == base:
                _at_most_its_own(row[system], doc["at_30"][base])
            _log(name, f"{system} at {base}'s {rate:.3g} req/s", row[system], ("cost_per_hour", "sim_p95_s"))
        b, c = row["boute"].get("cost_per_hour"), row[base].get("cost_per_hour")
        row["saving_protocol_a"] = _saving(b, NOMINAL_BUDGET)
        row["saving_equal_effort"] = _saving(b, c)
        if base == "cascadia":
            row["saving_equal_effort_same_mode"] = _saving(row["boute-cascade"].get("cost_per_hour"), c)
        row["boute_rate_per_dollar"] = rate / b if b else None
        row["baseline_rate_per_dollar"] = doc["at_30"][base]["rate_per_dollar"]
        doc["matched"][base] = row
    # (b) at the scenario's own targets (100 req/s): every system, equal effort
    for system in ("boute", *BASELINES, "boute-cascade"):
        track = f"exp/{NAME}/{name}/{system}-nominal/s{ctx.seed}/{ctx.preset}/{ctx.run_id}"
        found = cost_search(system, fam, None, ctx, st, track if system.startswith("boute") else None)
        doc["nominal"][system] = confirmed_cost(found, fam, None, st, ctx)
        _log(
            name, f"{system} at {sc.workload.rate_rps:g} req/s", doc["nominal"][system], ("cost_per_hour", "sim_p95_s")
        )
    doc["goal"] = goal(doc)
    for system, r in doc["nominal"].items():
        record(ctx, NAME, name, system, {"nominal": r, "at_30": doc["at_30"].get(system)})
    return doc


def _at_most_its_own(row: dict[str, Any], at30: dict[str, Any]) -> None:
    """A baseline serves its own $30/h rate with the plan that defined it (the simulator confirmed that plan
    at that rate), so its least cost there is at most that plan's, whatever its own cost search found: the
    rate sits at the edge of that plan's cap, where a fresh search's fast-path check can fall just short."""
    c = at30.get("plan_cost_per_hour")
    if c and (row.get("cost_per_hour") is None or c < row["cost_per_hour"]):
        row.update(
            {
                "cost_per_hour": c,
                "quality": at30.get("quality"),
                "sim_p95_s": at30.get("sim_p95_s"),
                "fractions": at30.get("fractions"),
                "plan": at30.get("plan"),
                "source": "its $30/h rate plan (simulator-confirmed at this rate by the rate protocol)",
            }
        )


def _log(scenario: str, what: str, r: dict[str, Any], keys: tuple[str, ...]) -> None:
    vals = ", ".join(f"{k} {r.get(k)!s:.8}" for k in keys)
    print(f"[{NAME}] {scenario} {what}: {vals}" + (f" ({r['note']})" if r.get("note") else ""), flush=True)


def run(ctx: Context, scenarios: tuple[str, ...] | None = None) -> dict[str, Any]:
    st = settings(ctx)
    out: dict[str, Any] = {"experiment": NAME, **ctx.stamp(), "settings": st, "scenarios": {}}
    for name in scenarios or st["scenarios"]:
        t0 = time.perf_counter()
        out["scenarios"][name] = run_scenario(name, ctx, st)
        out["scenarios"][name]["wall_s"] = time.perf_counter() - t0
        save_json(ctx, NAME, out)  # after every scenario: a long run keeps what it has
    out["summary"] = summarise(out["scenarios"])
    save_json(ctx, NAME, out)
    write_report(ctx, out)
    return out


def refresh(results: Any) -> dict[str, Any] | None:
    """Re-derive the goal, summary, markdown and plot of ``results/cost.json`` (``--report-only``)."""
    from experiments.common import load_json

    doc = load_json(results, NAME)
    if doc is None:
        return None
    ctx = Context(preset=doc["preset"], seed=doc["seed"], results=results, command=doc["command"])
    write_report(ctx, doc)
    save_json(ctx, NAME, doc)
    return doc
