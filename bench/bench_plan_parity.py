"""Same inputs, same plans: ``boute optimize`` on three scenarios x three objectives x seeds 0-2, against a reference.

A refactor must not move a plan (issue 49: "the same plans, same figures ... before and after"). Each case is
the user's command::

    boute optimize --scenario S [--objective cost | --mode cascade] --seed K --quiet --out plan.json

and its plan is compared with the reference's on what a plan promises: the deployment (tier, GPU, count,
TP, PP), the routing cut (fractions, thresholds, prices), the prediction (P95, $/h, quality, tier shares)
and the balance weights. The reference, ``bench/results/plan_parity_reference.json``, holds the plans of an
earlier commit (its ``commit`` field); ``python -m bench.bench_plan_parity --reference DIR COMMIT`` records
one from a folder of plan files written by these cases (named ``<case>.json``). A search is deterministic
for a seed (same trials, same order), so any difference is the code's, not noise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = Path(__file__).resolve().parent / "results" / "plan_parity_reference.json"
SCENARIOS = {
    "builtin": "builtin:paper-gsm8k",
    "three-tier-mix": "builtin:three-tier-mix",
    "mtbench-f81": "experiments/scenarios/mtbench-f81.yaml",
}
OBJECTIVES: dict[str, tuple[str, ...]] = {
    "latency": (),
    "cost": ("--objective", "cost"),
    "cascade": ("--mode", "cascade"),
}
SEEDS = (0, 1, 2)


def signature(doc: dict[str, Any]) -> dict[str, Any]:
    """What a plan promises, in a form two plans can be compared by."""
    r, p = doc["routing"], doc.get("predicted") or {}
    return {
        "deployment": sorted([g["tier"], g["gpu"], g["count"], g["tp"], g["pp"]] for g in doc["deployment"]),
        "cut": {k: r.get(k) for k in ("fractions", "thresholds", "prices")},
        "predicted": {k: p.get(k) for k in ("p95_latency_s", "cost_per_hour", "quality", "tier_shares")},
        "balance": doc.get("balance"),
    }


def _cases(quick: bool) -> list[tuple[str, str, tuple[str, ...], int]]:
    out = []
    for sname, scenario in SCENARIOS.items():
        for oname, args in OBJECTIVES.items():
            for seed in SEEDS:
                out.append((f"{sname}-{oname}-{seed}", scenario, args, seed))
    return out[:1] if quick else out


def _optimize(scenario: str, args: tuple[str, ...], seed: int, out: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "boute", "optimize", "--scenario", scenario, "--seed", str(seed), "--quiet"]
    cmd += [*args, "--out", str(out), "--db", f"sqlite:///{out.with_suffix('.db')}"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def _diff(ref: dict[str, Any], now: dict[str, Any]) -> list[str]:
    return [k for k in ("deployment", "cut", "predicted", "balance") if ref.get(k) != now.get(k)]


def run(quick: bool = False) -> dict[str, Any]:
    reference = json.loads(REFERENCE.read_text()) if REFERENCE.is_file() else {"commit": None, "plans": {}}
    cases: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="boute-bench-parity-") as tmp:
        for name, scenario, args, seed in _cases(quick):
            t0 = time.perf_counter()
            plan = Path(tmp) / f"{name}.json"
            res = _optimize(scenario, args, seed, plan)
            row: dict[str, Any] = {"rc": res.returncode, "wall_s": round(time.perf_counter() - t0, 1)}
            if res.returncode == 0:
                row["plan"] = signature(json.loads(plan.read_text()))
                ref = reference["plans"].get(name)
                row["differs_in"] = None if ref is None else _diff(ref, row["plan"])
            else:
                row["error"] = res.stderr.strip().splitlines()[-3:]
            cases[name] = row
            print(f"[plan_parity] {name}: rc={res.returncode} differs_in={row.get('differs_in')}", flush=True)
    compared = [c for c in cases.values() if c.get("differs_in") is not None]
    return {
        "reference_commit": reference["commit"],
        "compared": len(compared),
        "same_plan": sum(not set(c["differs_in"]) - {"balance"} for c in compared),
        "same_plan_and_balance": sum(not c["differs_in"] for c in compared),
        "cases": cases,
    }


def record_reference(folder: Path, commit: str) -> None:
    """Write the reference from ``folder``'s plan files (one per case, ``<case>.json``)."""
    plans = {p.stem: signature(json.loads(p.read_text())) for p in sorted(folder.glob("*.json")) if p.stem != "rows"}
    REFERENCE.write_text(json.dumps({"commit": commit, "plans": plans}, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--reference":
        record_reference(Path(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(
            "usage: python -m bench.bench_plan_parity --reference DIR COMMIT (the bench itself: python -m bench plan_parity)"
        )
