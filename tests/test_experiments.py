"""The experiment harness at smoke-test size (``--tiny``): every experiment runs end to end on the real
quality profiles, fast path, simulator, MOBO and tracking DB, so the harness cannot rot.

One module-scoped run of ``python -m experiments --tiny`` (in-process: the quality models load once) is
checked for: result files with provenance, figures that obey the experiment's own definitions, the
Cascadia MILP respecting inventory and budget, tracking rows, and the generated README.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments import EXPERIMENTS


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from experiments.__main__ import main

    out = tmp_path_factory.mktemp("experiments")
    assert main(["--tiny", "--out", str(out), "--db", f"sqlite:///{out / 'exp.db'}"]) == 0
    return out


def _doc(results: Path, name: str) -> dict:
    return json.loads((results / f"{name}.json").read_text())


@pytest.mark.slow  # runs every experiment at smoke size (minutes on 2 shared cores)
def test_every_experiment_writes_json_markdown_and_png(results: Path) -> None:
    pngs = {
        "main_comparison": "main_throughput",
        "scaling": "scaling",
        "ablations": "ablations",
        "sensitivity": "sensitivity",
        "cost": "cost",
    }
    for name in EXPERIMENTS:
        doc = _doc(results, name)
        assert doc["preset"] == "tiny" and doc["seed"] == 0 and "experiments" in doc["command"]
        assert (results / f"{name}.md").read_text().startswith("#")
        assert (results / f"{pngs[name]}.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # runs every experiment at smoke size (minutes on 2 shared cores)
def test_main_comparison_rows_follow_their_definitions(results: Path) -> None:
    from experiments.systems import SYSTEMS

    doc = _doc(results, "main_comparison")
    ((name, sc),) = doc["scenarios"].items()
    assert set(sc["rows"]) == set(SYSTEMS)
    for row in sc["rows"].values():
        if row.get("quality") is not None:  # a chosen plan meets the targets by the evaluator it was chosen by
            assert row["quality"] >= sc["quality_floor"] - 1e-9
            assert row["cost_per_hour"] <= 30 + 1e-6
            assert row["search_p95_s"] <= sc["p95_cap_s"]
            assert row["search_evaluator"] == ("sim" if row["system"] == "boute" else "fast")
        if row.get("sim_rate_rps") is not None:  # the simulator confirmed a rate at or below the fast one
            assert 0 < row["sim_rate_rps"] <= row["fast_rate_rps"] + 1e-9
        if row.get("min_cost_per_hour") is not None:
            assert row["min_cost_per_hour"] > 0
    assert sc["rows"]["cascadia"]["mode"] == "cascade"
    # gains are derived from the rows, not typed in
    for base, g in sc["gains"].items():
        tb, tr = sc["rows"]["boute"].get("sim_rate_rps"), sc["rows"][base].get("sim_rate_rps")
        if g["throughput_gain"] is not None:
            assert g["throughput_gain"] == pytest.approx(tb / tr - 1)


def test_cascadia_milp_respects_inventory_and_budget() -> None:
    from experiments.cascadia import latency_table, solve_deployment
    from experiments.common import Evaluators, load

    evs = Evaluators(load("mtbench-f83"), "cascade")
    table = latency_table(evs)
    assert table and all(e.rate_rps > 0 and e.p95_s > 0 for e in table)
    sc = evs.scenario
    loads = np.array([20.0, 4.0])
    dep = solve_deployment(evs, table, loads)
    assert dep is not None
    used: dict[str, int] = {}
    for g in dep:
        used[g.gpu] = used.get(g.gpu, 0) + g.gpus_used
    assert all(n <= sc.cluster.gpus[g] for g, n in used.items())
    assert sum(g.gpus_used * sc.price(g.gpu) for g in dep) <= sc.cluster.budget_per_hour + 1e-6
    assert {g.tier for g in dep} == {"small", "large"}
    # more load than the whole inventory can serve: no deployment rather than a wrong one
    assert solve_deployment(evs, table, np.array([1e5, 1e5])) is None


@pytest.mark.slow  # runs every experiment at smoke size (minutes on 2 shared cores)
def test_scaling_ablation_and_sensitivity_figures(results: Path) -> None:
    sc = _doc(results, "scaling")["rows"][0]
    assert sc["evals"] >= 1 and sc["wall_s"] > 0 and sc["dim"] > 0
    ab = _doc(results, "ablations")
    from experiments.ablations import VARIANTS

    assert set(ab["summary"]) == set(VARIANTS) and {"fast-objective", "no-prior"} <= set(VARIANTS)
    for r in ab["runs"]:  # best-so-far traces never get worse
        tr = [np.inf if v is None else v for v in r["trace"]]
        assert all(b <= a for a, b in zip(tr, tr[1:], strict=False))
    sens = _doc(results, "sensitivity")
    rows = {r["condition"]: r for r in sens["rows"]}
    assert rows["load x1.5"]["rate_rps"] == pytest.approx(1.5 * rows["nominal"]["rate_rps"])
    # same plan, 50% more load: the simulated P95 cannot improve
    assert rows["load x1.5"]["fixed_p95_s"] >= rows["nominal"]["fixed_p95_s"] * 0.98


@pytest.mark.slow  # runs every experiment at smoke size (minutes on 2 shared cores)
def test_tracking_rows_and_readme(results: Path) -> None:
    from boute.tracking import open_store

    store = open_store(f"sqlite:///{results / 'exp.db'}")
    try:
        rows = store.experiments()
    finally:
        store.close()
    names = [r["name"] for r in rows]
    assert any(n.startswith("exp/main_comparison/mtbench-f83/boute/") for n in names)
    assert any("/boute-trials/" in n and r["trials"] > 0 for n, r in zip(names, rows, strict=True))
    readme = (results / "README.md").read_text()
    for heading in (
        "## 1. Main comparison",
        "## 2. Scaling",
        "## 3. Ablations",
        "## 4. Sensitivity",
        "## 5. Cost at equal performance",
    ):
        assert heading in readme
    assert "+59%" in readme and "23.5 s" in readme


@pytest.mark.slow  # runs every experiment at smoke size (minutes on 2 shared cores)
def test_cost_figures_follow_their_definitions(results: Path) -> None:
    """Issue 12: every saving is derived from simulator-confirmed costs in the file, never typed in."""
    from experiments.cost_setup import BASELINES, NOMINAL_BUDGET

    doc = _doc(results, "cost")
    ((name, sc),) = doc["scenarios"].items()
    cap = sc["p95_cap_s"]
    assert set(sc["at_30"]) == {"boute", *BASELINES}
    for r in sc["at_30"].values():
        if r["sim_rate_rps"]:
            assert r["plan_cost_per_hour"] <= NOMINAL_BUDGET + 1e-6
            assert r["rate_per_dollar"] == pytest.approx(r["sim_rate_rps"] / r["plan_cost_per_hour"])
    confirmed = [row for r in sc["matched"].values() for k, row in r.items() if isinstance(row, dict)]
    confirmed += list(sc["nominal"].values())
    for row in confirmed:
        if row.get("cost_per_hour") is not None:  # a figure is always a plan the simulator accepted
            assert row["sim_p95_s"] <= cap and row["quality"] >= sc["quality_floor"] - 1e-9
            assert row["cost_per_hour"] <= sc["inventory_cost_per_hour"] + 1e-6
            if row.get("source") is None:  # its own search's cheapest plan the simulator confirmed
                tried = row["confirmations"]
                assert len(tried) <= doc["settings"]["confirm"] and any(c["meets"] for c in tried)
                assert row["cost_per_hour"] in [c["cost_per_hour"] for c in tried if c["meets"]]
    for base, r in sc["matched"].items():
        if "rate_rps" not in r:
            continue
        assert r["rate_rps"] == sc["at_30"][base]["sim_rate_rps"]
        b, c = r["boute"].get("cost_per_hour"), r[base].get("cost_per_hour")
        assert r["saving_protocol_a"] == (pytest.approx(1 - b / NOMINAL_BUDGET) if b else None)
        assert r["saving_equal_effort"] == (pytest.approx(1 - b / c) if b and c else None)
        # a baseline serves its own $30/h rate for at most what its rate plan costs
        assert c is None or c <= sc["at_30"][base]["plan_cost_per_hour"] + 1e-9
    assert "checks" in sc["goal"] and doc["summary"]["paper"]["saving_mean"] == 0.38


def test_unknown_experiment_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.__main__ import main

    assert main(["nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown experiment 'nope'" in err and "\n" not in err
