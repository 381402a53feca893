"""``boute simulate``: JSON output, and bad scenario/plan files as one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import run_cli

PLAN = {
    "routing": {"tiers": ["small", "large"], "fractions": [0.6, 0.4], "scorer": "length", "reference": "builtin:gsm8k"},
    "deployment": [
        {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090", "count": 2},
        {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4},
    ],
}
SCENARIO = """
name: tiny
cluster: {gpus: {h100-sxm: 4, rtx-4090: 4}, budget_per_hour: 30}
tiers:
  - {name: small, model: llama-3.1-8b, quality_model: mistralai/Mixtral-8x7B-Instruct-v0.1}
  - {name: large, model: llama-3.1-70b, quality_model: gpt-4-1106-preview}
workload: {arrivals: {kind: poisson}, rate_rps: 10, duration_s: 10}
"""


def test_simulate_prints_json(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "s.yaml").write_text(SCENARIO)
    (tmp_path / "p.json").write_text(json.dumps(PLAN))
    code, out, _ = run_cli(
        [
            "simulate",
            "--scenario",
            str(tmp_path / "s.yaml"),
            "--plan",
            str(tmp_path / "p.json"),
            "--json",
            "--rate",
            "8",
            "--seed",
            "1",
        ],
        capsys,
    )
    assert code == 0
    res = json.loads(out)
    for k in ("p50_latency_s", "p95_latency_s", "throughput_rps", "cost_per_hour"):
        assert isinstance(res[k], float) and res[k] > 0
    assert res["rate_rps"] == 8 and res["within_budget"] is True


@pytest.mark.parametrize(
    "what,edit,expect",
    [
        (
            "plan",
            lambda p, s: p["deployment"][0].update(gpu="rtx-9999"),
            r"p.json: deployment\[0\].gpu: unknown GPU 'rtx-9999'",
        ),
        ("plan", lambda p, s: p["deployment"][1].update(tp=3), r"p.json: deployment\[1\].tp: tp=3 does not divide"),
        (
            "plan",
            lambda p, s: p["deployment"][1].update(gpu="rtx-4090", tp=1),
            r"deployment\[1\] \(large: .*cannot serve",
        ),
        (
            "scenario",
            lambda p, s: s.replace("budget_per_hour: 30", "budget_per_hour: -5"),
            r"s.yaml: cluster.budget_per_hour: .*greater than 0",
        ),
        (
            "scenario",
            lambda p, s: s.replace("h100-sxm: 4,", "h100-sxm: 4, b300-xl: 2,"),
            r"s.yaml: cluster.gpus: unknown GPU 'b300-xl'",
        ),
        ("scenario", lambda p, s: s.replace("tiers:", "tiers: [\n"), r"s.yaml: line \d+: malformed YAML"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path: Path, capsys, what, edit, expect) -> None:  # type: ignore[no-untyped-def]
    import re

    plan = json.loads(json.dumps(PLAN))
    edited = edit(plan, SCENARIO)  # plan edits mutate `plan` in place; scenario edits return the new text
    scen = edited if what == "scenario" else SCENARIO
    (tmp_path / "s.yaml").write_text(scen)
    (tmp_path / "p.json").write_text(json.dumps(plan))
    code, out, err = run_cli(
        ["simulate", "--scenario", str(tmp_path / "s.yaml"), "--plan", str(tmp_path / "p.json"), "--json"], capsys
    )
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(expect, lines[0]), lines[0]


@pytest.mark.timeout(120)  # starts processes
def test_demo_command_runs_as_a_process() -> None:
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "boute.cli.main",
            "simulate",
            "--plan",
            "examples/plan-paper.json",
            "--json",
            "--duration",
            "10",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["within_budget"] and res["within_inventory"] and res["completed"] == res["requests"]


def test_simulate_uses_the_plans_scenario_and_a_calibration_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Without --scenario the plan's own scenario is simulated; --calibration (the file `boute profile perf`
    writes) replaces the efficiency factors: slower H100s give a longer P95 for the same plan."""
    (tmp_path / "s.yaml").write_text(SCENARIO)
    (tmp_path / "p.json").write_text(json.dumps({**PLAN, "scenario": str(tmp_path / "s.yaml")}))
    args = ["simulate", "--plan", str(tmp_path / "p.json"), "--json", "--seed", "1"]
    code, out, _ = run_cli(args, capsys)
    assert code == 0
    base = json.loads(out)
    assert base["scenario"] == "tiny" and base["rate_rps"] == 10
    (tmp_path / "cal.yaml").write_text("gpus:\n  h100-sxm: {compute: 0.2, bandwidth: 0.3}\n")
    code, out, _ = run_cli([*args, "--calibration", str(tmp_path / "cal.yaml")], capsys)
    assert code == 0
    slow = json.loads(out)
    assert slow["tiers"]["large"]["p95_latency_s"] > 1.2 * base["tiers"]["large"]["p95_latency_s"]
    (tmp_path / "bad.yaml").write_text("gpus:\n  no-such-gpu: {compute: 0.5}\n")
    code, out, err = run_cli([*args, "--calibration", str(tmp_path / "bad.yaml")], capsys)
    assert code == 2 and out == "" and "bad.yaml" in err and "no-such-gpu" in err and err.count("\n") == 1


def test_optimize_takes_a_calibration_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`boute optimize --calibration`: the search runs on the calibrated model (slower GPUs, longer P95)."""
    (tmp_path / "cal.yaml").write_text(
        "gpus:\n" + "".join(f"  {g}: {{compute: 0.2, bandwidth: 0.3}}\n" for g in ("h100-sxm", "rtx-4090"))
    )
    p95 = {}
    for name, extra in (("base", []), ("cal", ["--calibration", str(tmp_path / "cal.yaml")])):
        args = ["optimize", "-s", "builtin:small-live", "--max-evals", "12", "-q", "--no-confirm"]
        args += ["--db", f"sqlite:///{tmp_path / name}.db", "--out", str(tmp_path / f"{name}.json"), *extra]
        code, _, err = run_cli(args, capsys)
        assert code == 0, err
        p95[name] = json.loads((tmp_path / f"{name}.json").read_text())["predicted"]["p95_latency_s"]
    assert p95["cal"] > 1.2 * p95["base"], p95
