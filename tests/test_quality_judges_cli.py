"""LLM judge over real HTTP, quality_model_for on the built-in scenario, and the `boute router` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from boute.errors import SpecError
from boute.quality import LLMJudge, parse_rating, quality_model_for
from tests.cli import run_cli
from tests.judge_server import FakeJudge
from tests.waits import SAFETY_S


def test_parse_rating() -> None:
    assert parse_rating("The answer is right. Rating: [[9]]") == 9
    assert parse_rating("scale is [[1]] to [[10]]... my verdict: [[7.5]]") == 7.5
    assert parse_rating("Rating: 6") == 6
    assert parse_rating("I'd give it 4/10.") == 4
    assert parse_rating("3") == 3
    assert parse_rating("no number here") is None
    assert parse_rating("[[42]]") is None


async def test_llm_judge_over_http(judge_url: str) -> None:
    j = LLMJudge(judge_url, "judge-model", timeout=SAFETY_S, api_key="k")  # the happy path waits for the answer
    assert await j.ajudge("What is 2+2?", "4") == pytest.approx(7 / 9)
    sent = FakeJudge.seen[-1]
    assert sent["path"] == "/v1/chat/completions" and sent["body"]["model"] == "judge-model"
    assert "What is 2+2?" in sent["body"]["messages"][0]["content"] and sent["auth"] == "Bearer k"
    FakeJudge.reply = "I cannot decide."
    assert await j.ajudge("q", "a") == 0.0 and "no rating" in (j.last_error or "")
    FakeJudge.reply, FakeJudge.status = "Rating: [[10]]", 500
    assert await j.ajudge("q", "a") == 0.0 and "500" in (j.last_error or "")
    FakeJudge.status = 200
    scores = await j.ajudge_many([("q1", "a1"), ("q2", "a2"), ("q3", "a3")])
    np.testing.assert_allclose(scores, [1.0, 1.0, 1.0])


async def test_llm_judge_timeout_and_unreachable_escalate(judge_url: str) -> None:
    FakeJudge.delay = 1.0
    j = LLMJudge(judge_url, "m", timeout=0.2)
    assert await j.ajudge("q", "a") == 0.0  # the judge answers after 1 s: the 0.2 s timeout gave up first
    assert "Timeout" in (j.last_error or "")
    dead = LLMJudge("http://127.0.0.1:9/v1", "m", timeout=0.5)
    assert await dead.ajudge("q", "a") == 0.0


def test_quality_model_for_builtin_scenario(scenario) -> None:
    qm = quality_model_for(scenario)
    assert qm.tiers == ("small", "large")
    assert qm.tier_quality[0] < qm.tier_quality[1]
    assert quality_model_for(scenario) is qm  # memoised: built once per process
    r = qm.preroute([0.5, 0.5])
    assert qm.tier_quality[0] < r.quality < 1.0


def test_quality_model_for_unknown_model(scenario, tmp_path: Path) -> None:
    from boute.specs.scenario import Scenario

    data = scenario.model_dump(mode="json", exclude_none=True)
    data["tiers"][0]["quality_model"] = "no-such-model"
    bad = Scenario.model_validate(data)
    with pytest.raises(SpecError, match=r"tiers\[0\]\.quality_model.*no-such-model"):
        quality_model_for(bad)


def test_router_cli_train_and_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "router.npz"
    assert run_cli(["router", "train", "--profile", "builtin:gsm8k", "--out", str(out), "--seed", "1"]).returncode == 0
    train = json.loads(capsys.readouterr().out)
    assert train["tiers"] == ["mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"]  # by measured quality
    assert out.exists() and (tmp_path / "router.npz.json").exists()
    assert run_cli(["router", "eval", "--profile", "builtin:gsm8k", "--router", str(out), "--json"]).returncode == 0
    ev = json.loads(capsys.readouterr().out)
    assert set(ev) >= {"apgr", "cpt50", "cpt80", "curve", "at_large_share"}
    assert ev["n_test"] == train["n_test"]
    assert ev["curve"][0]["large_share"] == 0 and ev["curve"][-1]["large_share"] == 1
    assert ev["curve"][0]["router"] == pytest.approx(ev["quality_small"], abs=1e-4)
    assert (
        run_cli(["router", "eval", "--profile", "builtin:gsm8k", "--router", str(tmp_path / "nope.npz")]).returncode
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nope.npz" in err and err.count("\n") == 1
    bad_tiers = ["--tiers", "gpt-4-1106-preview,x"]
    assert run_cli(["router", "train", "--profile", "builtin:gsm8k", "--out", str(out), *bad_tiers]).returncode == 2
    assert "'x' is not a model" in capsys.readouterr().err
