"""Quality profiling: the GSM8K checker, and the whole run against two live emulated tiers.

The emulated tiers replay RouteLLM's recorded Mixtral and GPT-4 answers to the GSM8K test questions, and
RouteLLM labelled each of those answers correct or not; so the profile we write must agree with their
labels, which checks the checker on real model outputs, not on examples written for the test.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from backends.profile.quality import (
    Tier,
    gsm8k_correct,
    gsm8k_final_number,
    load_dataset,
    profile_quality,
)
from backends.supervisor import ProcessSpec, Supervisor
from boute.cli.main import main as cli_main
from boute.data import data_path
from boute.errors import BouteError, SpecError
from boute.quality.profiles import load_profile
from tests.services import free_port

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)

WEAK, STRONG = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("so 9 * 2 = $<<9*2=18>>18.\n#### 18", 18.0),
        ("The answer is $1,250.50.", 1250.5),
        ("She has 3 apples, then 5. Final: 8", 8.0),
        ("#### -4\nbut 7 later", -4.0),
        ("no number here", None),
    ],
)
def test_final_number(text: str, want: float | None) -> None:
    assert gsm8k_final_number(text) == want


def test_checker() -> None:
    assert gsm8k_correct("... #### 18", "Janet sells 9 eggs.\n#### 18") == 1.0
    assert gsm8k_correct("... #### 17", "#### 18") == 0.0
    assert gsm8k_correct("I don't know", "#### 18") == 0.0


def test_dataset_errors_name_file_and_line(tmp_path: Path) -> None:
    assert len(load_dataset("builtin:gsm8k-test", limit=5)) == 5
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"question": "q1", "answer": "#### 1"}\n{"answer": "#### 2"}\n')
    with pytest.raises(SpecError, match=r"d.jsonl: line 2, field 'question': missing"):
        load_dataset(str(bad))


def _labels(n: int) -> dict[str, np.ndarray]:
    """RouteLLM's correctness labels of the first n GSM8K test questions, per model."""
    csv.field_size_limit(1 << 26)
    with data_path("builtin:gsm8k").open(newline="", encoding="utf-8") as fh:
        rows = [r for _, r in zip(range(n), csv.DictReader(fh), strict=False)]
    return {m: np.array([r[m] == "True" for r in rows], dtype=float) for m in (WEAK, STRONG)}


@pytest.fixture(scope="module")
def tiers(tmp_path_factory: pytest.TempPathFactory) -> list[Tier]:
    pytest.importorskip("backends.emulated.server")
    out = []
    with Supervisor(tmp_path_factory.mktemp("logs")) as sup:
        for name, column in (("weak", WEAK), ("strong", STRONG)):
            port = free_port()
            argv = (sys.executable, "-m", "backends.emulated", "--model", "llama-3.2-1b", "--gpu", "h100-sxm")
            argv += ("--port", str(port), "--served-model-name", name, "--profile-model", column, "--speedup", "50")
            sup.start(ProcessSpec(name=name, argv=argv, health_url=f"http://127.0.0.1:{port}/health"))
            out.append(Tier(name=name, url=f"http://127.0.0.1:{port}/v1"))
        sup.wait_ready(timeout_s=60)
        yield out


def test_profile_agrees_with_routellm_labels(tiers: list[Tier], tmp_path: Path) -> None:
    n = 40
    out = tmp_path / "profile.jsonl"
    summary = profile_quality(
        load_dataset("builtin:gsm8k-test", n), tiers, out, max_tokens=1024, instruction="", concurrency=8
    )
    assert summary["failed_requests"] == {"weak": 0, "strong": 0}
    prof = load_profile(out)  # engineer C's loader reads what we wrote
    assert prof.models == ("weak", "strong") and len(prof) == n
    labels = _labels(n)
    for tier, column in (("weak", WEAK), ("strong", STRONG)):
        agree = float(np.mean(prof.column(tier) == labels[column]))
        assert agree >= 0.9, (tier, agree)
    assert prof.mean_quality()["strong"] > prof.mean_quality()["weak"]
    assert gsm8k_final_number(prof.responses["strong"][0]) == 18.0  # the recorded answer came through


def test_cli_quality_and_bad_tier(tiers: list[Tier], tmp_path: Path, capsys) -> None:
    out = tmp_path / "p.jsonl"
    args = ["profile", "quality", "--limit", "3", "--out", str(out), "--json", "--instruction", ""]
    for t in tiers:
        args += ["--tier", f"{t.name}={t.url}"]
    with pytest.raises(SystemExit) as ex:
        cli_main(args)
    assert ex.value.code == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 3
    assert len(out.read_text().splitlines()) == 3
    with pytest.raises(SystemExit) as ex:
        cli_main(["profile", "quality", "--tier", "weak", "--out", str(tmp_path / "x.jsonl")])
    assert ex.value.code == 2 and "expected NAME=URL" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
    with pytest.raises(BouteError, match="unique"):
        profile_quality(load_dataset("builtin:gsm8k-test", 1), [tiers[0], tiers[0]], tmp_path / "y.jsonl")
