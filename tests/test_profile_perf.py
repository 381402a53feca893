"""Performance profiling against a live endpoint: D's emulated SGLang stand-in, started by the supervisor.

The emulated backend times requests with the performance model itself, so calibrating against it must
recover factors whose predictions match what was measured: an end-to-end check of the sweep (streaming
TTFT/TPOT), the point mapping, the fit and the calibration file round trip. The CLI also records each run
and its load points in the tracking DB, read back by ``boute profile runs|show``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from backends.profile.calibrate import MeasuredReplica, compare, fit_sweep, measured_points, write_calibration
from backends.profile.loadgen import LoadPoint, run_sweep
from backends.supervisor import ProcessSpec, Supervisor
from boute.catalog import builtin_catalog
from boute.cli.main import main as cli_main
from boute.errors import BouteError
from boute.perf.calibration import apply_calibration, load_calibration
from boute.tracking import open_store
from tests.cli import run_cli
from tests.services import free_port

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)

UNREACHABLE_DB = "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1"

pytest.importorskip("backends.emulated.server")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One emulated llama-3.2-1b replica on an L4-class GPU, slowed down so times are well above noise."""
    port = free_port()
    argv = (sys.executable, "-m", "backends.emulated", "--model", "llama-3.2-1b", "--gpu", "rtx-4090")
    argv += ("--port", str(port), "--served-model-name", "small", "--speedup", "0.25", "--profile", "builtin:gsm8k")
    spec = ProcessSpec(name="emu", argv=argv, health_url=f"http://127.0.0.1:{port}/health")
    with Supervisor(tmp_path_factory.mktemp("logs")) as sup:
        sup.start(spec)
        sup.wait_ready(timeout_s=60)
        yield f"http://127.0.0.1:{port}"


def test_sweep_measures_streamed_ttft_and_tpot(emulated: str) -> None:
    points = [LoadPoint(concurrency=c, input_len=256, output_len=24, requests=4) for c in (1, 4)]
    res = run_sweep(emulated, "small", points, api="chat")
    assert [r.completed for r in res] == [4, 4] and all(r.failed == 0 for r in res)
    for r in res:
        assert 200 <= r.mean_input_tokens <= 320  # prompts sized in the endpoint's own tokens
        assert r.mean_output_tokens == pytest.approx(24, abs=1)
        assert r.ttft_ms_mean > 0 and r.tpot_ms_mean > 0 and r.ttft_ms_p95 >= r.ttft_ms_p50
    assert res[1].throughput_rps > res[0].throughput_rps  # batching engine: concurrency buys throughput


def test_calibration_recovers_the_emulated_timing(emulated: str, tmp_path: Path) -> None:
    cat = builtin_catalog()
    points = [LoadPoint(1, i, 24, 3) for i in (64, 512, 1024)] + [LoadPoint(4, 256, 24, 4)]
    res = run_sweep(emulated, "small", points)
    mps = measured_points(res, MeasuredReplica(model="llama-3.2-1b", gpu="rtx-4090"))
    assert {p.metric for p in mps} == {"ttft_ms", "tpot_ms"} and len(mps) == 8
    fit = fit_sweep(mps, cat, "rtx-4090")
    out = write_calibration(tmp_path / "cal.yaml", fit)
    cal = load_calibration(out)
    after = compare(mps, apply_calibration(cat, cal))
    errors = sorted(abs(r["error_pct"]) for r in after)
    assert errors[len(errors) // 2] < 25.0, after
    # the emulator runs 4x slower than the model at packaged factors: the fit must see that
    before = compare(mps, cat)
    assert sorted(abs(r["error_pct"]) for r in before)[len(before) // 2] > 40.0, before


def test_cli_profile_perf_writes_calibration_and_results(emulated: str, tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "cal.yaml"
    out.write_text(yaml.safe_dump({"gpus": {"h100-sxm": {"compute": 0.5}}}))  # other GPUs must survive
    db = f"sqlite:///{tmp_path / 'track.db'}"
    code, stdout, _ = run_cli(
        [
            "profile", "perf", "--endpoint", emulated + "/v1", "--model", "llama-3.2-1b", "--served-model", "small",
            "--gpu", "rtx-4090", "--concurrency", "1,2", "--input", "128,512", "--output", "16",
            "--requests", "2", "--out", str(out), "--db", db, "--json",
        ],
        capsys,
    )  # fmt: skip
    assert code == 0
    summary = json.loads(stdout)
    data = yaml.safe_load(out.read_text())
    assert data["gpus"]["h100-sxm"] == {"compute": 0.5} and "rtx-4090" in data["gpus"]
    assert summary["median_abs_error_pct_after"] < summary["median_abs_error_pct_before"]
    raw = json.loads(Path(summary["results"]).read_text())
    assert len(raw["points"]) == 4 and raw["meta"]["gpu"] == "rtx-4090" and "tracking" not in raw["meta"]

    # recorded in the tracking DB: the run, its fit, one row per load point with the summary's figures
    run_id = summary["profile_run"]
    store = open_store(db)
    try:
        run = store.profile_run(run_id)
        rows = store.profile_points(run_id)
    finally:
        store.close()
    assert run is not None
    assert (run["kind"], run["model"], run["gpu"], run["tp"], run["pp"], run["dtype"], run["status"]) == (
        "perf", "llama-3.2-1b", "rtx-4090", 1, 1, "bf16", "complete",
    )  # fmt: skip
    assert run["endpoint"] == emulated + "/v1" and run["calibration_path"] == str(out.resolve())
    assert run["calibration"]["efficiency"] == summary["efficiency"]
    assert run["calibration"]["fitted"] == summary["fitted"]
    assert run["calibration"]["median_abs_error_pct_after"] == summary["median_abs_error_pct_after"]
    settings = run["settings"]
    assert (settings["api"], settings["concurrency"], settings["inputs"], settings["outputs"]) == (
        "chat", [1, 2], [128, 512], [16],
    )  # fmt: skip
    assert run["points"] == 4 and [r["index"] for r in rows] == [0, 1, 2, 3]
    for row, pt in zip(rows, summary["points"], strict=True):
        assert row["concurrency"] == pt["concurrency"] and row["rate_rps"] is None
        assert round(row["ttft_ms_mean"], 2) == pt["ttft_ms"] and round(row["tpot_ms_mean"], 3) == pt["tpot_ms"]
        assert round(row["throughput_rps"], 3) == pt["throughput_rps"]
        assert round(row["input_tokens"], 1) == pt["input_tokens"] and row["output_len"] == 16
        assert row["ttft_ms_p95"] >= row["ttft_ms_p50"] > 0 and row["output_tokens_per_s"] > 0
        assert (row["completed"], row["failed"], row["errors"]) == (2, 0, [])

    # `boute profile runs` lists it (filtered by GPU), `boute profile show` prints it with its points
    code, stdout, _ = run_cli(["profile", "runs", "--db", db, "--json"], capsys)
    listed = json.loads(stdout)
    assert code == 0 and [r["id"] for r in listed] == [run_id] and listed[0]["points"] == 4
    code, stdout, _ = run_cli(["profile", "runs", "--db", db, "--gpu", "h100-sxm", "--json"], capsys)
    assert code == 0 and json.loads(stdout) == []
    code, stdout, _ = run_cli(["profile", "show", str(run_id), "--db", db, "--json"], capsys)
    shown = json.loads(stdout)
    assert code == 0 and shown["id"] == run_id and shown["gpu"] == "rtx-4090"
    assert [p["ttft_ms_mean"] for p in shown["points"]] == [r["ttft_ms_mean"] for r in rows]
    monkeypatch.setenv("COLUMNS", "200")  # Rich tables: wide enough not to wrap cells
    code, stdout, _ = run_cli(["profile", "runs", "--db", db], capsys)
    assert code == 0 and "rtx-4090" in stdout and "llama-3.2-1b" in stdout
    code, stdout, _ = run_cli(["profile", "show", str(run_id), "--db", db], capsys)
    assert code == 0 and f"profile run {run_id}" in stdout and "TTFT ms" in stdout
    assert f"{rows[0]['ttft_ms_mean']:,.2f}" in stdout


def test_profile_show_and_runs_errors_are_one_line(tmp_path: Path, capsys) -> None:
    db = f"sqlite:///{tmp_path / 'track.db'}"
    for argv, message in (
        (["profile", "show", "999", "--db", db], "no profiling run numbered 999"),
        (["profile", "show", "abc", "--db", db], "RUN_ID must be a run number, got 'abc'"),
        (["profile", "show", "1", "--db", UNREACHABLE_DB], "--db: cannot open tracking database"),
        (["profile", "runs", "--db", UNREACHABLE_DB], "--db: cannot open tracking database"),
        # the DB is opened before the sweep: an unreachable one fails at once (http://x is never contacted)
        (
            ["profile", "perf", "--endpoint", "http://x", "--model", "llama-3.2-1b", "--gpu", "rtx-4090"]
            + ["--db", UNREACHABLE_DB, "--out", str(tmp_path / "cal.yaml")],
            "--db: cannot open tracking database",
        ),
    ):
        code, out, err = run_cli(argv, capsys)
        assert code == 2 and out == "", argv
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
        assert "Traceback" not in err
    code, out, _ = run_cli(["profile", "runs", "--db", db, "--json"], capsys)
    assert code == 0 and json.loads(out) == []
    assert not (tmp_path / "cal.yaml").exists()


def test_cli_errors_are_one_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as ex:
        cli_main(["profile", "perf", "--endpoint", "http://x", "--model", "nope", "--gpu", "h100-sxm"])
    assert ex.value.code == 2 and "unknown model 'nope'" in capsys.readouterr().err
    with pytest.raises(BouteError, match="--concurrency"):
        from boute.cli.profile_cmd import _ints

        _ints("1,x", "concurrency")
