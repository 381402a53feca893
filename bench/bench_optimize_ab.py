"""The default search of a git ref against the working tree, interleaved: what one change did to the wall time.

A 2-core machine's wall time moves by 30-50% between machines and by 10% with whatever else runs, so a change
is measured against the code before it in alternating runs on the same machine, minutes apart: for each round
and seed, the ref's search, then the working tree's. Each run is a fresh process (``make_plan`` as ``boute
optimize`` runs it, :func:`bench.bench_optimize_scale._run`) started in its own checkout, the ref's a
temporary ``git worktree`` sharing this venv; where the change should not alter the search, its P95 and
evaluations must be the ref's (``same_search``), since a search is a function of its trials.

``BOUTE_BENCH_AB_REF`` (default ``HEAD``: the last commit against uncommitted changes), ``BOUTE_BENCH_AB_SCENARIOS``
(comma-separated; default the 480-GPU fleet, ``experiments/scenarios/fleet-8x60.yaml``), ``BOUTE_BENCH_AB_SEEDS``
(default ``0``) and ``BOUTE_BENCH_AB_ROUNDS`` (default 2; ``--quick``: 1).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.bench_optimize_scale import summary_row

ROOT = Path(__file__).resolve().parent.parent

#: one search in the checkout it runs in (cwd and first on the path): prints its figures as one JSON line
_CHILD = """
import json, sys, tempfile, warnings
from pathlib import Path
warnings.filterwarnings("ignore")
from bench.bench_optimize_scale import _run
with tempfile.TemporaryDirectory() as t:
    r = _run(sys.argv[1], Path(t) / "plan.json", seed=int(sys.argv[2]))
print(json.dumps(r))
"""


def _search(root: Path, scenario: str, seed: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, scenario, str(seed)], cwd=root, env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"search in {root} failed: {out.stderr[-2000:]}")
    return summary_row(json.loads(out.stdout.strip().splitlines()[-1]))


def run(quick: bool = True) -> dict[str, Any]:
    ref = os.environ.get("BOUTE_BENCH_AB_REF", "HEAD")
    scenarios = os.environ.get("BOUTE_BENCH_AB_SCENARIOS", "experiments/scenarios/fleet-8x60.yaml").split(",")
    seeds = [int(s) for s in os.environ.get("BOUTE_BENCH_AB_SEEDS", "0").split(",")]
    rounds = 1 if quick else int(os.environ.get("BOUTE_BENCH_AB_ROUNDS", "2"))
    commit = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), ref], cwd=ROOT, check=True)
        try:
            rows = []
            for n in range(rounds):
                for scenario in scenarios:
                    for seed in seeds:
                        for side, root in (("ref", before), ("tree", ROOT)):
                            row = {"round": n, "scenario": scenario, "seed": seed, "side": side}
                            row.update(_search(root, scenario, seed))
                            print(f"[optimize_ab] {row}", flush=True)
                            rows.append(row)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
    return {"ref": ref, "ref_commit": commit.stdout.strip(), "rows": rows, "summary": _summary(rows)}


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario and seed: each side's median wall and pool time, the ratio tree / ref, and whether both
    sides made the same search (P95 and evaluations)."""
    out = []
    for key in sorted({(r["scenario"], r["seed"]) for r in rows}):
        mine = [r for r in rows if (r["scenario"], r["seed"]) == key]
        side = {s: [r for r in mine if r["side"] == s] for s in ("ref", "tree")}
        wall = {s: statistics.median(r["wall_s"] for r in side[s]) for s in side}
        pool = {s: statistics.median(r["pool_s"] or 0.0 for r in side[s]) for s in side}
        out.append(
            {
                "scenario": key[0],
                "seed": key[1],
                "wall_s": wall,
                "pool_s": pool,
                "wall_ratio": round(wall["tree"] / wall["ref"], 3),
                "p95_s": {s: side[s][0]["p95_s"] for s in side},
                "same_search": len({(r["p95_s"], r["evaluations"]) for r in mine}) == 1,
            }
        )
    return out
