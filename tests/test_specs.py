"""Scenario and plan specs: the built-in example loads; bad files give one-line errors naming file+field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from boute.errors import SpecError
from boute.scenarios import builtin_scenario_path
from boute.specs import Plan, load_plan, load_scenario, save_plan

BUILTIN = builtin_scenario_path("paper-gsm8k").read_text()


def _write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_builtin_scenario_is_the_paper_setting(scenario) -> None:
    assert scenario.name == "paper-gsm8k"
    assert dict(scenario.cluster.gpus) == {"h100-sxm": 8, "rtx-pro-6000": 8, "rtx-5090": 8, "rtx-4090": 8}
    assert scenario.cluster.budget_per_hour == 30
    assert [t.model for t in scenario.tiers] == ["llama-3.1-8b", "llama-3.1-70b"]
    assert scenario.workload.rate_rps == 100


@pytest.mark.parametrize(
    ("old", "new", "field", "reason"),
    [
        ("rtx-4090: 8}", "rtx-4091: 8}", "cluster.gpus", "unknown GPU 'rtx-4091'"),
        ("budget_per_hour: 30", "budget_per_hour: -3", "cluster.budget_per_hour", "greater than 0"),
        ("model: llama-3.1-70b,", "model: llama-9,", "tiers[1].model", "unknown model 'llama-9'"),
        ("quality_floor: 0.69", "quality_floor: 1.5", "targets.quality_floor", "less than or equal to 1"),
        ("rate_rps: 100", "rate_rps: 100\n  colour: blue", "workload.colour", "unknown field"),
    ],
)
def test_bad_scenario_names_file_field_reason(tmp_path: Path, old: str, new: str, field: str, reason: str) -> None:
    assert old in BUILTIN
    path = _write(tmp_path, BUILTIN.replace(old, new))
    with pytest.raises(SpecError) as err:
        load_scenario(path)
    msg = str(err.value)
    assert "\n" not in msg
    assert err.value.file == str(path) and err.value.field == field, msg
    assert reason in err.value.reason


def test_malformed_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"line \d+: malformed YAML"):
        load_scenario(_write(tmp_path, "cluster: [\n"))
    with pytest.raises(SpecError, match="file not found"):
        load_scenario(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="expected a mapping"):
        load_scenario(_write(tmp_path, "- 1\n- 2\n"))


def test_user_gpu_and_model_in_scenario_file(tmp_path: Path) -> None:
    extra = """
gpus:
  - {name: my-gpu, tflops_bf16: 100, memory_gb: 48, bandwidth_gbs: 900, link_gbs: 32, price_per_hour: 0.5}
models:
  - {name: my-model, params_b: 3, layers: 24, hidden: 3072, heads: 24, kv_heads: 8, head_dim: 128, ffn: 8192, vocab: 32000}
"""
    text = BUILTIN.replace("rtx-4090: 8}", "rtx-4090: 8, my-gpu: 4}").replace(
        "model: llama-3.1-8b,", "model: my-model,"
    )
    sc = load_scenario(_write(tmp_path, text + extra))
    assert sc.catalog.gpu("my-gpu").memory_gb == 48
    assert sc.price("my-gpu") == 0.5
    assert sc.tiers[0].model == "my-model"


def _plan_dict(**over) -> dict:
    plan = {
        "routing": {
            "mode": "preroute",
            "tiers": ["small", "large"],
            "fractions": [0.6, 0.4],
            "scorer": "length",
            "reference": "builtin:gsm8k",
        },
        "deployment": [
            {"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090", "count": 4},
            {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4},
        ],
    }
    plan.update(over)
    return plan


def test_plan_round_trip_json_and_yaml(tmp_path: Path) -> None:
    plan = Plan.model_validate(_plan_dict())
    for name in ("p.json", "p.yaml"):
        out = save_plan(plan, tmp_path / name)
        again = load_plan(out)
        assert again == plan
    assert plan.gpus_used() == {"rtx-4090": 4, "h100-sxm": 4}
    assert not list(tmp_path.glob(".*")), "atomic write left a temp file behind"


@pytest.mark.parametrize(
    ("mutate", "field", "reason"),
    [
        (lambda d: d["deployment"][1].update(tp=3), "deployment[1].tp", "does not divide"),
        (lambda d: d["deployment"][0].update(gpu="rtx-9999"), "deployment[0].gpu", "unknown GPU"),
        (lambda d: d["routing"].update(fractions=[0.7, 0.7]), "routing", "sum to 1"),
        (lambda d: d["deployment"][0].update(count=0), "deployment[0].count", "greater than 0"),
        (lambda d: d["deployment"].pop(1), "(root)", "no replicas"),
    ],
)
def test_bad_plan_names_field(tmp_path: Path, mutate, field: str, reason: str) -> None:
    data = _plan_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError) as err:
        load_plan(path)
    assert err.value.file == str(path)
    assert (err.value.field or "(root)").startswith(field), str(err.value)
    assert reason in err.value.reason


@pytest.mark.timeout(120)  # starts processes
def test_cli_reports_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = _write(tmp_path, BUILTIN.replace("budget_per_hour: 30", "budget_per_hour: -3"))
    proc = subprocess.run(
        [sys.executable, "-m", "boute.cli.main", "validate", "--scenario", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert f"{bad}: cluster.budget_per_hour:" in lines[0]


def test_plans_name_a_scenario_that_loads_again(tmp_path) -> None:
    """A plan records where its scenario came from, so `boute serve`/`deploy` of it find the scenario
    (plans once recorded the bare name, which deploy could not open)."""
    import numpy as np

    from boute.optimize.evaluators import candidate_plan
    from boute.optimize.space import Space
    from boute.specs import load_scenario

    builtin = load_scenario("builtin:small-live")
    cand = Space.build(builtin).decode(np.full(Space.build(builtin).dim, 0.5))
    assert candidate_plan(builtin, cand, router="r.npz").scenario == "builtin:small-live"
    copy = tmp_path / "mine.yaml"
    copy.write_text(builtin.source.read_text())
    mine = load_scenario(copy)
    ref = candidate_plan(mine, cand, router="r.npz").scenario
    assert ref == str(copy.resolve()) and load_scenario(ref).name == "small-live"
    assert load_scenario("small-live").reference == "builtin:small-live"  # older plans' bare names
