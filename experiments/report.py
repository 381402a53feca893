"""Generate ``experiments/results/README.md`` from the experiments' JSON results (never from hand-typed numbers).

Each section embeds the experiment's table(s) and plot, sets our headline figures beside the paper's, and
states where they differ and why. Sections whose results are missing say how to produce them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.common import fmt, load_json, table

PAPER = {
    "throughput_gain_mean": 0.59,
    "throughput_gain_max": 1.57,
    "cost_saving_mean": 0.38,
    "wall_3x24_s": 23.5,
    "wall_6x48_s": 72.0,
}

CAVEATS = """## Why our numbers differ from the paper's (read this first)

* **Our simulator, not their testbed.** Every latency and throughput here comes from BOute's own
  performance model (a calibrated roofline: prefill compute-bound, decode memory-bound) through the
  analytical fast path and the discrete-event simulator. No GPU was used. The paper measures real vLLM
  deployments; its performance database has 2-7% error against them, ours has not been validated on the
  four GPU types at all. Absolute latencies and rates are therefore approximate; the *relative* comparison
  (same model, same workload, same budget for every system) is the meaningful part.
* **Our data.** Quality comes from real per-query results (RouteLLM's GSM8K and MT-Bench evaluations) of
  Mixtral-8x7B and GPT-4, standing in for the paper's Llama-3.1-8B and 70B, whose per-query results we do
  not have; performance is modelled for the Llama pair. The quality gap of our pair is wider on GSM8K
  (63.8% -> 85.7%) than the paper's (84.5 -> 95.1), so each floor sits at the same *position* of the gap.
  MT-Bench has 160 queries (48 held out), so its quality figures are coarse (steps of ~0.2 points).
* **MT-Bench floors.** The paper does not give its models' MT-Bench scores; we assume its floors
  8.1 / 8.3 / 8.5 sit at 25% / 50% / 75% of its small-to-large gap and place ours at the same positions
  (raw 8.56 / 8.78 / 9.01 on our 8.34 -> 9.23 pair). MT-Bench answers are long (mean 336 output tokens vs
  107 on GSM8K), which makes 100 req/s within $30/h hard for any 70B-heavy plan in our model.
* **BOute searches as `boute optimize` does: the simulator is its objective** (MOBO whose GP corrects the
  fast path, batches of 4 on one worker process per core). The baselines search as their own designs would,
  on the fast path (enumerations, random sampling, a MILP), and their plans' latencies and rates are
  confirmed by the simulator. So BOute's plans are chosen by the evaluator that judges them and the baselines' are not: that
  is the product's design (issue 27), and an advantage no baseline here is given.
* **Baselines are our renditions.** Heterogeneous 70B-alone and one-GPU-type are searched by random
  sampling; RouteLLM uses the smallest large-tier share meeting the floor with an equal budget per tier;
  the Cascadia-style baseline serves a cascade (judge per hop) with a MILP deployment (HiGHS via SciPy)
  over a latency table from the same fast path and thresholds by a penalty search.
* **Throughput metric.** Max offered rate whose P95 stays under the cap at the nominal $30/h with the
  quality floor met: fast-path bisection over each system's best plans, then the simulator's own bisection
  below that rate where it disagrees (8 halvings in the full preset: within 0.4% of the fast rate). The
  paper's exact protocol may differ. Cost is the cheapest plan found by bisection on the budget, re-running
  each system's own search at every step (BOute's MOBO warm-starts from its trials at higher budgets).
* **The main comparison's cost column has unequal search effort, and BOute optimised the wrong thing there.**
  At each budget step BOute got only a short MOBO run minimising P95 (not cost), while the baselines were
  exhaustive enumerations, dense random searches or a MILP that sizes capacity to the load. Section 5
  measures cost properly: BOute with ``--objective cost``, every system with the same number of evaluations
  (the simulator's for BOute, the fast path's for the baselines), every figure confirmed by the simulator,
  and the paper's protocol (the least budget at which BOute matches each baseline's $30/h performance).
* **70B alone cannot serve 100 req/s within $30/h in our performance model** (its max rate under the P95
  cap is below 100 req/s on every GPU type and on the pool), and even the whole inventory does not buy
  enough, so its cost to meet the targets is undefined and excluded from the cost averages; its
  throughput figure is still compared.
* **Wall times** are measured on a 2-core CPU shared with other jobs (BoTorch fits dominate); the paper's
  hardware is not stated in our notes.
"""


def _md(results: Path, name: str) -> str | None:
    p = results / f"{name}.md"
    return p.read_text().split("\n", 1)[1].strip() if p.is_file() else None


def _img(results: Path, name: str) -> str:
    return f"![{name}]({name}.png)\n" if (results / f"{name}.png").is_file() else ""


def _details(results: Path, name: str) -> list[str]:
    """An experiment's own markdown (after its title) and its figure, as a section ends with them."""
    body = _md(results, name)
    return [*([body] if body else []), _img(results, name)]


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.0%}"


def _range(d: dict[str, Any]) -> str:
    """``min .. max`` of a summary with ``pairs``, or n/a."""
    return f"{_pct(d.get('min'))} .. {_pct(d.get('max'))}" if d.get("pairs") else "n/a"


def _headline_cost(results: Path) -> dict[str, Any]:
    """The cost saving the report leads with: section 5's protocol (a), the one cost measurement (empty
    when the cost experiment has not run)."""
    from experiments.cost import refresh

    doc = refresh(results)
    return ((doc or {}).get("summary") or {}).get("protocol_a", {})


def main_section(results: Path) -> list[str]:
    doc = load_json(results, "main_comparison")
    out = ["## 1. Main comparison\n"]
    if doc is None:
        return [*out, "Not run yet: `python -m experiments main_comparison`.\n"]
    out.append(f"Preset `{doc['preset']}`, command `{doc['command']}`, seed {doc['seed']}, run {doc['run_id']}.\n")
    sm = doc.get("summary") or {}
    cost = _headline_cost(results)
    out.append(
        table(
            ["figure", "ours", "paper"],
            [
                ["throughput gain at equal budget and quality, mean", _pct(sm.get("throughput_gain_mean")), "+59%"],
                ["throughput gain, max", _pct(sm.get("throughput_gain_max")), "+157%"],
                ["cost saving at equal performance, mean (section 5, protocol (a))", _pct(cost.get("mean")), "38%"],
                ["cost saving, range (section 5, protocol (a))", _range(cost), "15% .. 61%"],
                ["(scenario, baseline) pairs with a throughput figure on both sides", sm.get("pairs"), "n/a"],
            ],
        )
        + "\n"
    )
    if sm.get("cost_saving_mean") is not None:
        out.append(
            "The cost rows come from section 5, which searches cost with `--objective cost` and the paper's "
            "protocol. This experiment's own budget bisection (a short P95-minimising search at each budget "
            f"against exhaustive baselines) gives {_pct(sm.get('cost_saving_mean'))} "
            f"({_pct(sm.get('cost_saving_min'))} .. {_pct(sm.get('cost_saving_max'))}); it measures how fast "
            "a latency search stumbles on a cheap plan, not the cost BOute can reach, and is kept only so that "
            "the two can be told apart.\n"
        )
    p95 = [
        s["rows"]["boute"]["sim_p95_s"] / s["rows"]["routellm-equal"]["sim_p95_s"] - 1
        for n, s in doc["scenarios"].items()
        if n.startswith("gsm8k")
        and s["rows"].get("boute", {}).get("sim_p95_s")
        and s["rows"].get("routellm-equal", {}).get("sim_p95_s")
    ]
    if p95:
        out.append(
            f"P95 latency of BOute's plan against RouteLLM's on GSM8K (simulator, mean over {len(p95)} "
            f"floors): {_pct(sum(p95) / len(p95))} (paper: -50% on average).\n"
        )
    unreached = [
        (n, r["system"])
        for n, s in doc["scenarios"].items()
        for r in s["rows"].values()
        if r.get("min_cost_per_hour") is None
    ]
    if unreached:
        out.append(
            "Systems that meet the targets at no budget up to the GPU inventory (their cost saving is "
            "not defined and is left out of the averages): " + ", ".join(f"{s} on {n}" for n, s in unreached) + ".\n"
        )
    body = _md(results, "main_comparison")
    if body:
        out.append(body.split("\n", 1)[1] if body.startswith("Command") else body)
    out += [_img(results, "main_throughput"), _img(results, "main_cost")]
    return out


def scaling_section(results: Path) -> list[str]:
    doc = load_json(results, "scaling")
    out = ["## 2. Scaling\n"]
    if doc is None:
        return [*out, "Not run yet: `python -m experiments scaling`.\n"]
    by = {r["scenario"]: r for r in doc["rows"]}
    cmp = [
        [k, fmt(by[k].get("wall_to_converge_s")), fmt(by[k].get("wall_s")), fmt(by[k].get("evals_to_converge")), paper]
        for k, paper in (("scaling-3x24", "23.5 s"), ("scaling-6x48", "1.2 min"))
        if k in by
    ]
    out.append(
        table(
            [
                "scenario",
                "ours: wall to converge s",
                "ours: wall to stop s",
                "ours: evals to converge",
                "paper: converge",
            ],
            cmp,
        )
        + "\n"
    )
    out += _details(results, "scaling")
    return out


def ablation_section(results: Path) -> list[str]:
    doc = load_json(results, "ablations")
    out = ["## 3. Ablations\n"]
    if doc is None:
        return [*out, "Not run yet: `python -m experiments ablations`.\n"]
    sm = doc["summary"]
    b = sm.get("boute", {})
    rows = []
    for v, s in sm.items():
        ratio = (
            (s["evals_to_best_median"] / b["evals_to_best_median"])
            if (s.get("evals_to_best_median") and b.get("evals_to_best_median"))
            else None
        )
        rows.append([v, s["evals_to_best_median"], ratio, s["wall_per_eval_s"], s["wall_s_mean"]])
    out.append(
        "Paper: without its structural encodings BOute needs ~8x more evaluations; without the "
        "performance database (simulator in the loop) a search takes 12-30+ min.\n"
    )
    out.append(table(["variant", "evals to best (median)", "x BOute's", "wall s / eval", "wall s / run"], rows) + "\n")
    out += _details(results, "ablations")
    return out


def sensitivity_section(results: Path) -> list[str]:
    doc = load_json(results, "sensitivity")
    out = ["## 4. Sensitivity\n"]
    if doc is None:
        return [*out, "Not run yet: `python -m experiments sensitivity`.\n"]
    out += _details(results, "sensitivity")
    broke = [r["condition"] for r in doc["rows"] if not r["fixed_meets"]]
    fixed = [r["condition"] for r in doc["rows"] if not r["fixed_meets"] and r.get("reopt_meets")]
    out.append(
        f"The unchanged plan misses the targets under: {', '.join(broke) or 'none'}; re-optimising "
        f"recovers: {', '.join(fixed) or 'none'}.\n"
    )
    return out


def cost_section(results: Path) -> list[str]:
    from experiments.cost import refresh

    doc = refresh(results)  # goal and summary re-derived from the data
    out = ["## 5. Cost at equal performance (issue 12)\n"]
    if doc is None:
        return [*out, "Not run yet: `python -m experiments cost`.\n"]
    sm = doc.get("summary") or {}
    a, a70, b = (
        sm.get("protocol_a", {}),
        sm.get("protocol_a_without_70b", {}),
        sm.get("equal_effort_at_matched_rates", {}),
    )

    out.append(f"Preset `{doc['preset']}`, command `{doc['command']}`, seed {doc['seed']}, run {doc['run_id']}.\n")
    out.append(
        "(a) is the paper's protocol as we read it: each baseline's max rate under the cap at the floor with "
        "$30/h, then the least budget at which BOute (``--objective cost``) serves that rate; saving = 1 - B/30. "
        "(b) gives every system the same number of evaluations to find its own cheapest plan for the same rate "
        "(BOute's are simulator runs, the baselines' fast-path evaluations followed by simulator confirmations). "
        "(c) is req/s per $/h.\n"
    )
    out.append(
        table(
            ["figure", "ours", "paper"],
            [
                ["(a) cost saving at the baselines' $30/h performance, mean", _pct(a.get("mean")), "38%"],
                ["(a) range", _range(a), "15% .. 61%"],
                ["(a) (scenario, baseline) pairs", a.get("pairs"), "n/a"],
                ["(a) mean without the 70B-alone baselines", _pct(a70.get("mean")), "n/a"],
                ["(b) saving vs each baseline's own cheapest plan, equal effort, mean", _pct(b.get("mean")), "n/a"],
                ["(b) range", _range(b), "n/a"],
                [
                    "scenarios where BOute is cheapest or within 5% everywhere",
                    ", ".join(sm.get("goal_holds_on") or []) or "none",
                    "n/a",
                ],
            ],
        )
        + "\n"
    )
    out.append(_cost_findings(doc))
    body = _md(results, "cost")
    if body:
        out.append(body.split("\n", 1)[1] if body.startswith("Command") else body)
    out.append(_img(results, "cost"))
    return out


def _cost_findings(doc: dict[str, Any]) -> str:
    """What holds and what does not, read off the data (no figure typed in)."""
    neg = [
        f"{b} on {n} ({_pct(r['saving_protocol_a'])} by (a), {_pct(r['saving_equal_effort'])} by (b))"
        for n, s in doc["scenarios"].items()
        for b, r in s["matched"].items()
        if "rate_rps" in r and min(r["saving_protocol_a"] or 0, r["saving_equal_effort"] or 0) < 0
    ]
    cross = [
        f"{n}, {c['where']}: x{c['ratio']:.2f}"
        for n, s in doc["scenarios"].items()
        for c in s["goal"].get("preroute_vs_cascadia", [])
        if c.get("ratio") and not c["holds"]
    ]
    own = [
        f"{b} on {n}"
        for n, s in doc["scenarios"].items()
        for b, r in s["matched"].items()
        if "rate_rps" in r and r[b].get("source")
    ]
    none = [n for n, s in doc["scenarios"].items() if not any(r.get("cost_per_hour") for r in s["nominal"].values())]
    casc = [c for s in doc["scenarios"].values() for c in s["goal"]["checks"] if c["where"].startswith("cascade")]
    casc_ok = all(c["holds"] for c in casc)
    lines = [
        "What does not hold, and why (from the rows below):",
        "",
        "* BOute (preroute) is not cheaper than: " + ("; ".join(neg) or "none") + ". Across routing modes, "
        "against Cascadia's cascade: " + ("; ".join(cross) or "none") + ". On GSM8K the cascade's judge sees "
        "the small model's answer, so less load reaches the 70B tier for the same floor; BOute in cascade mode "
        "(same routing as Cascadia) is "
        + ("within 5% of Cascadia or cheaper in every case" if casc_ok else "not always within 5% of Cascadia")
        + " (the goal rows).",
        "* A baseline's least cost at its own $30/h rate is its $30/h rate plan where its own cost search did "
        "not confirm a cheaper one (the rate sits at that plan's cap, where a fresh fast-path check falls just "
        "short): " + ("; ".join(own) or "none") + ".",
        "* No system meets the scenario's 100 req/s with the whole inventory on: "
        + (", ".join(none) or "none")
        + "; the comparison there is at the baselines' own rates only.",
        "* The 70B-alone baselines raise the mean of (a): without them it is "
        f"{_pct((doc.get('summary') or {}).get('protocol_a_without_70b', {}).get('mean'))}.",
    ]
    return "\n".join(lines) + "\n"


def write_readme(results: Path) -> Path:
    from boute.specs.io import write_atomic

    parts: list[Any] = [
        "# BOute experiments: results\n",
        "Generated by `python -m experiments` (see `experiments/`); every figure below is read from the JSON "
        "files in this folder, which record the command, seed and scenario that produced them. The tracking DB "
        "(`experiments.db`, git-ignored) holds one experiment per row plus every BOute trial "
        "(`boute experiments list --db sqlite:///experiments/results/experiments.db`).\n",
        CAVEATS,
        *main_section(results),
        *scaling_section(results),
        *ablation_section(results),
        *sensitivity_section(results),
        *cost_section(results),
    ]
    path = results / "README.md"
    results.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "\n".join(p.rstrip() + "\n" for p in parts if p))
    return path
