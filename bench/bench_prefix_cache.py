"""Prefix caching across the seams (issue 51's table): what the optimiser promises and ``boute verify`` measures
on traffic whose prompts share prefixes, with the gateway's prefix affinity on and off (least load).

For each scenario and balancing, the user's commands::

    boute optimize --scenario S --affinity|--no-affinity --out plan.json
    boute verify --plan plan.json --stream-share 0.1 --json

The plan is judged by the simulator under the balancing it will be served with (its replicas' prefix caches
modelled by boute/perf/prefix_cache.py); verify serves it on emulated SGLang replicas (the same cache over
real token pieces, timed by the performance model: approximate), replays the scenario's traffic at full rate
(speedup 1) and reads the replicas' reported ``cached_tokens``. TTFT is measured on a 10% streamed sample.
The load average is recorded around each verify (2-core host).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("builtin:shared-system-prompt", "builtin:mtbench-conversations")
BALANCING = ("--no-affinity", "--affinity")


def _boute(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "boute", *args], cwd=ROOT, capture_output=True, text=True)


def _check(out: dict[str, Any], name: str) -> dict[str, Any]:
    return next((c for c in out["checks"] if c["name"] == name), {})


def _case(scenario: str, balancing: str, work: Path, duration: float | None) -> dict[str, Any]:
    plan = work / "plan.json"
    opt = _boute(
        "optimize", "--scenario", scenario, balancing, "--out", str(plan), "-q", "--db", f"sqlite:///{work}/b.db"
    )
    if opt.returncode != 0:
        return {"error": opt.stderr.strip().splitlines()[-1:]}
    pred = json.loads(plan.read_text())["predicted"]
    load0 = os.getloadavg()[0]
    args = ["verify", "--plan", str(plan), "--stream-share", "0.1", "--json"]
    ver = _boute(*args, *(("--duration", str(duration)) if duration else ()))
    if ver.returncode not in (0, 1):
        return {"error": ver.stderr.strip().splitlines()[-1:], "predicted": pred}
    out = json.loads(ver.stdout)
    m = out["measured"]
    return {
        "verified": out["ok"],
        "failed_checks": [c["name"] for c in out["checks"] if not c["ok"]],
        "cost_per_hour": pred["cost_per_hour"],
        "p95_s": {"promised": pred["p95_latency_s"], "measured": m["p95_s"]},
        "ttft_p50_s": {"promised": pred.get("ttft_p50_s"), "measured": m.get("ttft_p50_s")},
        "ttft_p95_s": {"promised": pred.get("ttft_p95_s"), "measured": m.get("ttft_p95_s")},
        "cached_token_share": {"promised": pred.get("cached_token_share"), "measured": m.get("cached_token_share")},
        "p95_check": _check(out, "P95 (s)"),
        "cached_check": _check(out, "cached token share"),
        "requests": m["requests"],
        "failed": m["failed"],
        "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }


def _row(name: str, balancing: str, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"| {name} | {balancing} | error: {r['error']} |"

    def pm(key: str, fmt: str) -> str:
        p, m = r[key]["promised"], r[key]["measured"]
        return f"{format(p, fmt) if p is not None else '-'} / {format(m, fmt) if m is not None else '-'}"

    ok = "yes" if r["verified"] else "no: " + ", ".join(r["failed_checks"])
    return (
        f"| {name} | {balancing.removeprefix('--')} | ${r['cost_per_hour']:.2f} | {pm('p95_s', '.3f')} | "
        f"{pm('ttft_p50_s', '.3f')} | {pm('ttft_p95_s', '.3f')} | {pm('cached_token_share', '.3f')} | {ok} |"
    )


def run(quick: bool = False) -> dict[str, Any]:
    duration = 20.0 if quick else None
    rows: dict[str, dict[str, Any]] = {}
    lines = [
        "| scenario | balancing | $/h | P95 s (promised / measured) | TTFT p50 s | TTFT p95 s | cached share | verified |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scenario in SCENARIOS:
        for balancing in BALANCING:
            with tempfile.TemporaryDirectory(prefix="boute-bench-prefix-") as tmp:
                r = _case(scenario, balancing, Path(tmp), duration)
            rows[f"{scenario} {balancing}"] = r
            lines.append(_row(scenario.removeprefix("builtin:"), balancing, r))
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    (ROOT / "bench" / "results" / "prefix_cache.md").write_text(table + "\n")
    return {"rows": rows, "table": table, "duration_s": duration or "the scenario's"}
