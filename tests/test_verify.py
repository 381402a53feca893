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


def _move(made: Path, moved: Path) -> Path:
    """``made``'s plan.json and its bundle copied to ``moved``, then ``made`` deleted: the plan travels."""
    moved.mkdir()
    shutil.copy(made / "plan.json", moved / "plan.json")
    shutil.copytree(bundle_dir(made / "plan.json"), bundle_dir(moved / "plan.json"))
    shutil.rmtree(made)
    return moved


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
    assert plan.routing.scorer == "ladder" and plan.routing.thresholds is not None
    assert plan.routing.router is not None and plan.routing.router.startswith("plan.bundle/router-")
    assert plan.predicted is not None and plan.predicted.tier_shares is not None

    moved = _move(made, tmp_path / "moved")

    r = _boute("verify", "--plan", "plan.json", "--duration", "40", "--speedup", "8", "--json", "--explain", cwd=moved)
    assert r.returncode in (0, 1), r.stderr  # 1: a check outside tolerance (small samples), still a verdict
    out = json.loads(r.stdout)
    m = out["measured"]
    assert m["requests"] > 50 and m["failed"] == 0
    # --explain: every answer says why, by the plan's thresholds, each tier's scores on its side of them
    why = out["explain"]
    assert (why["explained"], why["unexplained"], why["inconsistent"]) == (m["requests"], 0, 0)
    cut = [round(t, 4) for t in plan.routing.thresholds]
    for t in why["tiers"]:
        assert t["how"] == {"threshold": t["requests"]} and t["requests"] == round(
            m["shares"][t["tier"]] * m["requests"]
        )
        assert set(t["above"]) | set(t["upto"]) <= set(cut)
    assert m["answers_match_profile"] == 1.0  # every answer is the answering tier's own recorded one
    names = {c["name"] for c in out["checks"]}
    assert {"share small", "share large", "quality", "quality 95% LCB", "P95 (s)", "failed requests"} <= names
    lcb = next(c for c in out["checks"] if c["name"] == "quality 95% LCB")
    assert lcb["promised"] == plan.predicted.quality_bound < plan.predicted.quality  # both figures, mean and bound
    assert abs(sum(m["shares"].values()) - 1.0) < 1e-9
    # the learned router is in the path: both tiers answer, in about the promised proportion
    promised = plan.predicted.tier_shares
    assert abs(m["shares"].get("large", 0.0) - promised[1]) < 0.15, (m["shares"], promised)

    r = _boute(
        "verify", "--plan", "plan.json", "--duration", "10", "--speedup", "8", "--tol-p95", "0", "--explain", cwd=moved
    )  # fmt: skip
    assert r.returncode == 1 and "NOT verified" in r.stdout, r.stdout + r.stderr
    assert "why requests went where they went" in r.stdout and "threshold" in r.stdout, r.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)  # a cascade optimisation (the verifier trained on GSM8K's answers), then one verify run
def test_a_cascade_is_judged_by_the_verifier_it_was_optimised_with(tmp_path: Path) -> None:
    """The cascade's verifier travels in the bundle and the gateway runs it on each answer: escalations
    happen at about the promised rate (a judge that ignored the answer, the old stand-in, accepted nearly
    every first answer), every answer is the answering tier's own, and verify reports hop by hop."""
    made = tmp_path / "made"
    made.mkdir()
    r = _boute(
        "optimize", "--scenario", "builtin:small-live", "--mode", "cascade", "--max-evals", "10",
        "--out", "plan.json", "-q", "--db", f"sqlite:///{made / 'b.db'}", cwd=made,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    plan = open_plan(made / "plan.json")
    rt = plan.routing
    assert rt.mode == "cascade" and rt.judge == "verifier" and rt.thresholds is not None and rt.router is None
    assert rt.verifier is not None and rt.verifier.startswith("plan.bundle/verifier-")
    # the static verifier's weights, metadata, token table and tokenizer: nothing else (no router, no MiniLM)
    # (the table and tokenizer are named by their content: static-<hash>.npy and .tokenizer.json)
    files = {a.path for a in plan.artifacts} - {rt.verifier, rt.verifier + ".json"}
    assert sorted(Path(f).suffix for f in files) == [".json", ".npy"], files
    assert all(Path(f).parent == Path(rt.verifier).parent for f in files)
    moved = _move(made, tmp_path / "moved")

    r = _boute("verify", "--plan", "plan.json", "--duration", "60", "--speedup", "4", "--json", "--explain", cwd=moved)
    assert r.returncode in (0, 1), r.stderr  # 1: a check outside tolerance (small samples), still a verdict
    out = json.loads(r.stdout)
    m, checks = out["measured"], {c["name"]: c for c in out["checks"]}
    # --explain: the verifier's verdict at the first hop, its scores on the right side of its threshold
    first = out["explain"]["hops"][0]
    assert first["tier"] == "small" and first["reached"] == m["requests"] and out["explain"]["inconsistent"] == 0
    assert first["threshold"] == round(rt.thresholds[0], 4)
    passed_over = first["verdicts"].get("escalated", 0) + first["verdicts"].get("judge-failed", 0)
    assert passed_over == round(checks["escalated"]["measured"] * m["requests"])
    assert m["requests"] > 120 and m["failed"] == 0 and m["answers_match_profile"] == 1.0
    assert {"share small", "share large", "escalated", "accepted at small", "quality"} <= set(checks)
    promised = plan.predicted.tier_shares
    assert promised is not None and 0.05 < promised[1] < 0.5
    assert checks["escalated"]["promised"] == pytest.approx(promised[1])
    assert abs(checks["escalated"]["measured"] - promised[1]) < 0.1, checks["escalated"]
    assert checks["accepted at small"]["measured"] == pytest.approx(1 - checks["escalated"]["measured"])
    assert abs(m["quality"] - plan.predicted.quality) < 0.1, (m["quality"], plan.predicted.quality)
