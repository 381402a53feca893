"""``boute perf``: JSON keys, infeasible answers, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)

BOUTE = [sys.executable, "-m", "boute.cli.main", "perf"]
KEYS = {"ttft_ms", "tpot_ms", "output_tokens_per_s", "max_batch", "weights_gb_per_gpu", "kv_capacity_tokens",
        "fits", "reason"}  # fmt: skip


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BOUTE, *args], capture_output=True, text=True, timeout=60, check=False)


def test_json_answer_and_calibration(tmp_path: Path) -> None:
    base = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--pp", "1", "--dtype", "bf16",
            "--batch", "64", "--input", "128", "--output", "128", "--json"]  # fmt: skip
    out = _run(*base)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep.keys() >= KEYS and rep["fits"] is True and rep["reason"] is None
    assert rep["batch"] == 64 and rep["max_batch"] > 64 and rep["ttft_ms"] > 0 and rep["tpot_ms"] > 0
    assert rep["output_tokens_per_s"] > 0 and rep["weights_gb_per_gpu"] == 16.06
    cal = tmp_path / "cal.yaml"
    cal.write_text("gpus:\n  h100-sxm: {bandwidth: 0.3}\n")
    slow = json.loads(_run(*base, "--calibration", str(cal)).stdout)
    assert slow["tpot_ms"] > rep["tpot_ms"] * 1.5


def test_infeasible_is_an_answer_and_unknown_names_are_errors() -> None:
    out = _run("--model", "llama-3.1-70b", "--gpu", "rtx-4090", "--json")
    assert out.returncode == 0
    rep = json.loads(out.stdout)
    assert rep["fits"] is False and "weights need" in rep["reason"] and rep["ttft_ms"] is None
    bad = _run("--model", "llama-9", "--gpu", "h100-sxm", "--json")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "unknown model 'llama-9'" in bad.stderr
    cal = _run("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--calibration", "/nonexistent/c.yaml")
    assert cal.returncode == 2 and "/nonexistent/c.yaml" in cal.stderr and "Traceback" not in cal.stderr


def test_table_output() -> None:
    out = _run("--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4")
    assert out.returncode == 0 and "ttft_ms" in out.stdout and "approximate" in out.stdout
