"""One workload per search (issue 49 item 5): how far the plan's balance weights and its verified P95 move.

Before, a search judged plans on one stream (the scenario's arrivals carrying the quality model's held-out
prompts: what the simulator, the fast path and ``boute verify`` replay) while the capacity screen and the
written plan's balance weights (``Plan.balance``: each replica group's capacity under the stream's request
lengths, what the gateway balances mixed-GPU replicas by) were computed on the whole profile's stream. Now
the search's own stream is built once and handed to all of them.

For each case the plan is made by the user's command (``boute optimize --seed 0``), then served and
verified twice per round with the same deployment and routing, once balanced by the whole-profile weights
(before) and once by the search stream's (after, what the plan now carries), rounds interleaved::

    boute optimize --scenario S [--mode M] --seed 0 --out plan.json
    boute verify --plan plan.json --json                       (full rate, speedup 1)

The weights are the simulator's capacities (req/s per replica); within a tier the gateway sends each
replica a share proportional to them, so the figure that matters is each group's share of its tier's
capacity. ``verify`` runs on emulated replicas timed by the performance model (approximate), at the
scenario's rate on this 2-core host: the load average is recorded around each verify.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: (scenario, mode): the built-in one, three-tier-mix (its latency plan spreads the mid tier over two GPU
#: types) and the built-in cascade (its large tier on H100 and RTX 5090)
CASES = (
    ("builtin:paper-gsm8k", "preroute"),
    ("builtin:three-tier-mix", "preroute"),
    ("builtin:paper-gsm8k", "cascade"),
)
ROUNDS = 2


def _boute(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "boute", *args], cwd=ROOT, capture_output=True, text=True)


def _balances(plan_path: Path) -> tuple[Any, Any]:
    """The plan's balance (the search stream's) and the one the whole-profile stream gives."""
    from boute.serving.bundle import open_plan, plan_scenario
    from boute.sim.weights import plan_balance

    plan = open_plan(plan_path)
    sc = plan_scenario(plan, plan_path)
    return plan.balance, plan_balance(plan.deployment, sc)


def _tier_shares(plan_path: Path, capacity: list[float]) -> list[dict[str, Any]]:
    """Each replica group's share of its tier's capacity under ``capacity`` (what the gateway balances by)."""
    from boute.serving.bundle import open_plan

    groups = open_plan(plan_path).deployment
    tier_total: dict[str, float] = {}
    for g, c in zip(groups, capacity, strict=True):
        tier_total[g.tier] = tier_total.get(g.tier, 0.0) + g.count * c
    return [
        {
            "group": f"{g.tier}:{g.gpu}x{g.count} tp{g.tp}",
            "capacity_rps": round(c, 4),
            "tier_share": round(g.count * c / tier_total[g.tier], 4),
        }
        for g, c in zip(groups, capacity, strict=True)
    ]


def _with_balance(src: Path, dest: Path, balance: Any) -> None:
    """A copy of the plan (its bundle folder shared: artifacts resolve against the plan's folder) with
    ``balance`` in place of its own."""
    from boute.specs.plan import load_plan, save_plan

    save_plan(load_plan(src).model_copy(update={"balance": balance}), dest)


def _verify(plan: Path) -> dict[str, Any]:
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    ver = _boute("verify", "--plan", str(plan), "--json")
    out: dict[str, Any] = {"verify_s": round(time.perf_counter() - t0, 1), "rc": ver.returncode}
    out["load"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    try:
        doc = json.loads(ver.stdout)
    except json.JSONDecodeError:
        out["error"] = (ver.stderr or ver.stdout).strip().splitlines()[-3:]
        return out
    m = doc.get("measured", {})
    out.update(ok=doc.get("ok"), p95_s=m.get("p95_s"), p50_s=m.get("p50_s"), failed=m.get("failed"))
    return out


def _case(scenario: str, mode: str, work: Path) -> dict[str, Any]:
    plan = work / "plan.json"
    opt = _boute(
        "optimize",
        "--scenario",
        scenario,
        "--mode",
        mode,
        "--seed",
        "0",
        "--quiet",
        "--out",
        str(plan),
        "--db",
        f"sqlite:///{work / 'boute.db'}",
    )
    if opt.returncode != 0:
        return {"error": opt.stderr.strip().splitlines()[-3:]}
    after, before = _balances(plan)
    variants = {"before": work / "plan-whole-profile.json", "after": work / "plan-search-stream.json"}
    _with_balance(plan, variants["before"], before)
    _with_balance(plan, variants["after"], after)
    doc = json.loads(plan.read_text())
    out: dict[str, Any] = {
        "promised_p95_s": doc["predicted"]["p95_latency_s"],
        "deployment": [f"{g['tier']}:{g['gpu']}x{g['count']} tp{g['tp']}" for g in doc["deployment"]],
        "lengths": {"before": before.lengths.model_dump(), "after": after.lengths.model_dump()},
        "weights": {
            "before": _tier_shares(plan, before.capacity_rps),
            "after": _tier_shares(plan, after.capacity_rps),
        },
        "verify": {"before": [], "after": []},
    }
    shares = [(b["tier_share"], a["tier_share"]) for b, a in zip(*out["weights"].values(), strict=True)]
    out["max_tier_share_move"] = round(max(abs(a - b) for b, a in shares), 4)
    for _ in range(ROUNDS):
        for name, path in variants.items():
            r = _verify(path)
            out["verify"][name].append(r)
            print(f"[search_workload] {scenario} {mode} {name}: P95 {r.get('p95_s')} ok={r.get('ok')}", flush=True)
    return out


def run(quick: bool = False) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for scenario, mode in CASES[:1] if quick else CASES:
        with tempfile.TemporaryDirectory(prefix="boute-bench-workload-") as tmp:
            cases[f"{scenario} [{mode}]"] = _case(scenario, mode, Path(tmp))
    return {
        "command": "boute optimize --scenario S --mode M --seed 0 --out plan.json; "
        "boute verify --plan plan.json --json (balance: whole profile vs the search's stream)",
        "rounds": ROUNDS,
        "cases": cases,
    }
