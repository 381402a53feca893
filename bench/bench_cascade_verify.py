"""Promised vs served, for every routing mode: ``boute optimize`` then ``boute verify`` at the scenario's rate.

Issue 29 asks that a cascade plan serve as optimised (tier shares and per-hop acceptance within 2 points,
quality within 0.02, P95 within 15%, 0 failed) on the built-in scenario, MT-Bench and a 3-tier
ARC-Challenge scenario from the RouterBench files; the pre-routed plans of the same scenarios are checked
beside them. Each run is the user's commands, as processes:

    boute optimize --scenario S --mode M --seed 0 --out plan.json
    boute verify --plan plan.json --json          (full rate, speedup 1, the scenario's duration)

``boute verify`` serves the plan on emulated replicas (modelled GPU timing, real HTTP, the plan's own
router or judge in the gateway) and replays the plan's scenario workload with the held-out prompts. Wall
figures depend on the host: the load average is recorded before and after each verify, since a 2-core
host that is busy elsewhere delays the emulated replicas' event loops (milliseconds that matter where a
request takes 0.1 s, as on RouterBench). ``BOUTE_BENCH_VERIFY_CASES=scenario:mode,...`` runs a subset and
keeps the other cases of the last run as they were (each case records when it ran and the load around it);
a mode ``preroute+multi`` pre-routes with the multi-model router (``--router multi``, issue 31), on the 3-
and 4-tier RouterBench scenarios beside the ladder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LAST = Path(__file__).resolve().parent / "results" / "cascade_verify.json"
CASES = (
    ("builtin:paper-gsm8k", "cascade"),
    ("experiments/scenarios/mtbench-f81.yaml", "cascade"),
    ("builtin:routerbench-3tier", "cascade"),
    ("builtin:paper-gsm8k", "preroute"),
    ("experiments/scenarios/mtbench-f81.yaml", "preroute"),
    ("builtin:routerbench-3tier", "preroute"),
    ("builtin:routerbench-3tier", "preroute+multi"),
    ("builtin:routerbench-4tier", "preroute"),
    ("builtin:routerbench-4tier", "preroute+multi"),
)


def _cases() -> list[tuple[str, str]]:
    env = os.environ.get("BOUTE_BENCH_VERIFY_CASES")
    if not env:
        return list(CASES)
    return [(c.rsplit(":", 1)[0], c.rsplit(":", 1)[1]) for c in env.split(",") if c.strip()]


def _boute(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "boute", *args], cwd=ROOT, capture_output=True, text=True)


def _one(scenario: str, case_mode: str, work: Path) -> dict[str, Any]:
    plan = work / "plan.json"
    mode, _, router = case_mode.partition("+")
    t0 = time.perf_counter()
    opt = _boute(
        "optimize",
        "--scenario",
        scenario,
        "--mode",
        mode,
        "--seed",
        "0",
        "--out",
        str(plan),
        "--db",
        f"sqlite:///{work / 'boute.db'}",
        *(("--router", router) if router else ()),
    )
    out: dict[str, Any] = {"optimize_s": round(time.perf_counter() - t0, 1), "optimize_rc": opt.returncode}
    if opt.returncode != 0:
        out["error"] = opt.stderr.strip().splitlines()[-3:]
        return out
    doc = json.loads(plan.read_text())
    out["routing"] = {
        k: doc["routing"].get(k) for k in ("mode", "tiers", "fractions", "thresholds", "prices", "scorer", "judge")
    }
    out["predicted"] = doc.get("predicted")
    out["deployment"] = doc.get("deployment")
    out["load_before"] = os.getloadavg()
    t0 = time.perf_counter()
    ver = _boute("verify", "--plan", str(plan), "--json")
    out["verify_s"] = round(time.perf_counter() - t0, 1)
    out["load_after"] = os.getloadavg()
    out["verify_rc"] = ver.returncode
    try:
        out["verify"] = json.loads(ver.stdout)
    except json.JSONDecodeError:
        out["error"] = (ver.stderr or ver.stdout).strip().splitlines()[-3:]
    return out


def _table(v: dict[str, Any]) -> list[str]:
    """The verdict's checks as markdown rows: check | promised | measured | tolerance | ok."""
    rows = []
    for c in v.get("checks", []):
        p = "-" if c["promised"] is None else f"{c['promised']:.4g}"
        rows.append(f"| {c['name']} | {p} | {c['measured']:.4g} | {c['tolerance']} | {'yes' if c['ok'] else 'NO'} |")
    return rows


def _last_cases() -> dict[str, Any]:
    """The cases of the last run (a subset run keeps the rest)."""
    try:
        return dict(json.loads(LAST.read_text())["results"]["cases"])
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return {}


def run(quick: bool = False) -> dict[str, Any]:
    results = _last_cases() if os.environ.get("BOUTE_BENCH_VERIFY_CASES") else {}
    for scenario, mode in _cases():
        with tempfile.TemporaryDirectory(prefix="boute-bench-verify-") as tmp:
            r = _one(scenario, mode, Path(tmp))
        v = r.get("verify") or {}
        r["ok"] = bool(v.get("ok"))
        r["when"] = datetime.now(UTC).isoformat(timespec="seconds")
        r["table"] = _table(v)
        results[f"{scenario} [{mode}]"] = r
        print(f"[cascade_verify] {scenario} {mode}: ok={r['ok']}", flush=True)
        for line in r["table"]:
            print("   ", line, flush=True)
    return {
        "command": "boute optimize --scenario S --mode M [--router R] --seed 0 --out plan.json; "
        "boute verify --plan plan.json --json",
        "all_ok": all(r["ok"] for r in results.values()),
        "cases": results,
    }
