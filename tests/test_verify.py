"""Across the seams: `boute optimize` writes a plan bundle with its learned router, the bundle moves,
`boute verify` serves it on emulated backends, replays the scenario's traffic and compares."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from boute.serving.bundle import bundle_dir, open_plan


def _boute(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "boute", *argv], cwd=cwd, capture_output=True, text=True, check=False)


@pytest.mark.slow
@pytest.mark.timeout(240)  # an optimisation, then two verify runs (40 s and 10 s of traffic at speedup 8) as processes
def test_optimised_plan_moved_and_verified_under_its_own_traffic(tmp_path: Path) -> None:
    made = tmp_path / "made"
    made.mkdir()
    r = _boute(
        "optimize", "--scenario", "builtin:small-live", "--max-evals", "10", "--out", "plan.json", "-q",
        "--db", f"sqlite:///{made / 'b.db'}", cwd=made,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    plan = open_plan(made / "plan.json")
    assert plan.routing.scorer == "learned" and plan.routing.thresholds is not None
    assert plan.routing.router is not None and plan.routing.router.startswith("plan.bundle/router-")
    assert plan.predicted is not None and plan.predicted.tier_shares is not None

    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(made / "plan.json", moved / "plan.json")
    shutil.copytree(bundle_dir(made / "plan.json"), bundle_dir(moved / "plan.json"))
    shutil.rmtree(made)

    r = _boute("verify", "--plan", "plan.json", "--duration", "40", "--speedup", "8", "--json", cwd=moved)
    assert r.returncode in (0, 1), r.stderr  # 1: a check outside tolerance (small samples), still a verdict
    out = json.loads(r.stdout)
    m = out["measured"]
    assert m["requests"] > 50 and m["failed"] == 0
    assert m["answers_match_profile"] == 1.0  # every answer is the answering tier's own recorded one
    names = {c["name"] for c in out["checks"]}
    assert {"share small", "share large", "quality", "quality 95% LCB", "P95 (s)", "failed requests"} <= names
    lcb = next(c for c in out["checks"] if c["name"] == "quality 95% LCB")
    assert lcb["promised"] == plan.predicted.quality_bound < plan.predicted.quality  # both figures, mean and bound
    assert abs(sum(m["shares"].values()) - 1.0) < 1e-9
    # the learned router is in the path: both tiers answer, in about the promised proportion
    promised = plan.predicted.tier_shares
    assert abs(m["shares"].get("large", 0.0) - promised[1]) < 0.15, (m["shares"], promised)

    r = _boute("verify", "--plan", "plan.json", "--duration", "10", "--speedup", "8", "--tol-p95", "0", cwd=moved)
    assert r.returncode == 1 and "NOT verified" in r.stdout, r.stdout + r.stderr
