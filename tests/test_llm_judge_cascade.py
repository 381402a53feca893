"""An LLM judge modelled honestly: profiled with the gateway's own request, read back checked, and the
cascade's thresholds cut on its recorded scores, its latency charged, the plan naming it.

The tiers and the judge are :class:`tests.judge_server.FakeJudge` over real HTTP (one server, a reply per
requested model); everything of ours runs as it does in production.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from backends.profile.quality import Example, Tier, profile_quality
from boute.errors import SpecError
from boute.quality import LLMJudge
from boute.quality.build import build_quality_model
from boute.quality.policy_quality import QualityModel
from boute.quality.profiles import load_profile
from tests.cli import run_cli
from tests.judge_server import FakeJudge
from tests.services import free_port
from tests.waits import SAFETY_S

_ANSWER = re.compile(r"\[The Start of Assistant's Answer\]\n(.*)\n\[The End of Assistant's Answer\]", re.S)


def _tier_answer(tier: str) -> object:
    """A tier's reply: the question's number, doubled by the large tier (so the two tiers' answers differ)."""

    def reply(content: str) -> str:
        n = int(re.findall(r"\d+", content)[-1])
        return f"Working... the {tier} tier says #### {n * (2 if tier == 'large' else 1)}"

    return reply


def _rate(content: str) -> str:
    """The judge: a rating from the answer's number (1-10); answers ending in 7 get no rating (a failed call)."""
    answer = _ANSWER.search(content)
    n = int(re.findall(r"\d+", answer.group(1))[-1]) if answer else 0
    return "I cannot tell." if n % 10 == 7 else f"Looks fine. Rating: [[{1 + n % 10}]]"


def _serve(judge_url: str) -> tuple[list[Tier], Tier]:
    FakeJudge.models = {"small-m": _tier_answer("small"), "large-m": _tier_answer("large"), "judge-m": _rate}
    tiers = [Tier("small", judge_url, "small-m"), Tier("large", judge_url, "large-m")]
    return tiers, Tier("strict", judge_url, "judge-m")


def test_profile_records_the_scores_the_gateways_judge_gives(judge_url: str, tmp_path: Path) -> None:
    tiers, judge = _serve(judge_url)
    examples = [Example(f"What is {n} times one?", f"#### {n}") for n in range(1, 13)]
    out = tmp_path / "p.jsonl"
    summary = profile_quality(examples, tiers, out, cascade_judge=judge, instruction="", judge_timeout_s=SAFETY_S)
    assert summary["cascade_judge"]["calls"] == 24 and summary["cascade_judge"]["failed"] == 1  # small: 7
    profiled = [s for s in FakeJudge.seen if s["body"]["model"] == "judge-m"]

    prof = load_profile(out)
    rec = prof.judge
    assert rec is not None and (rec.name, rec.model, rec.calls) == ("strict", "judge-m", 24)
    assert 0 < rec.latency_s < SAFETY_S and rec.latency_s == pytest.approx(summary["cascade_judge"]["mean_latency_s"])
    # the gateway's judge, asked about the very (prompt, answer) pairs the profile holds, gives its scores
    gateway = LLMJudge(judge_url, "judge-m", timeout=SAFETY_S)
    for m in ("small", "large"):
        pairs = list(zip(prof.prompts, prof.responses[m], strict=True))
        want = asyncio.run(gateway.ajudge_many(pairs))
        np.testing.assert_array_equal(rec.scores[m], want)
    assert rec.scores["small"][6] == 0.0 and rec.scores["large"][3] == pytest.approx(8 / 9)  # 7: no rating; 8: [[9]]
    # ... with byte-identical requests (one template, one request builder)
    asked = [s for s in FakeJudge.seen if s["body"]["model"] == "judge-m"][len(profiled) :]
    key = lambda s: json.dumps(s["body"], sort_keys=True)  # noqa: E731
    assert sorted(map(key, profiled)) == sorted(map(key, asked)) and profiled[0]["path"] == "/v1/chat/completions"


def test_cli_records_the_cascade_judge(judge_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiers, _ = _serve(judge_url)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"q {n}", "answer": f"#### {n}"}) + "\n" for n in (3, 4)))
    out = tmp_path / "p.jsonl"
    args = ["profile", "quality", "--dataset", str(data), "--out", str(out), "--json", "--instruction", ""]
    args += [f"--tier={t.name}@{t.model}={t.url}" for t in tiers]
    got = run_cli([*args, f"--cascade-judge=strict@judge-m={judge_url}"], capsys)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["cascade_judge"]["model"] == "judge-m"
    line = json.loads(out.read_text().splitlines()[0])
    assert line["judge"] == {"name": "strict", "model": "judge-m"}
    assert line["judge_scores"] == {"small": pytest.approx(3 / 9), "large": pytest.approx(6 / 9)}
    assert set(line["judge_latency_s"]) == {"small", "large"}
    bad = run_cli([*args, "--cascade-judge=judge-m"], capsys)
    assert bad.returncode == 2 and "--cascade-judge: expected NAME=URL" in bad.stderr


def _line(n: int, **judge: object) -> dict[str, object]:
    row: dict[str, object] = {"prompt": f"question {n}", "scores": {"a": 0, "b": 1}, "responses": {"a": "x", "b": "y"}}
    return {**row, **judge}


JUDGED = {"judge": {"name": "j", "model": "m"}, "judge_scores": {"a": 0.5}, "judge_latency_s": {"a": 0.2}}


@pytest.mark.parametrize(
    ("second", "where", "why"),
    [
        ({**JUDGED, "judge_scores": {"a": 1.5}}, "line 2, field 'judge_scores.a'", r"expected a number in \[0, 1\]"),
        ({**JUDGED, "judge_scores": {"a": True}}, "line 2, field 'judge_scores.a'", "expected a number"),
        ({**JUDGED, "judge_scores": {"c": 0.5}}, "line 2, field 'judge_scores.c'", "'c' is not one of a, b"),
        ({**JUDGED, "judge_scores": {"a": 0.5, "b": 0.5}}, "line 2, field 'judge_scores'", "judges"),
        ({**JUDGED, "judge": {"name": "j", "model": "other"}}, "line 2, field 'judge'", "differs from line 1"),
        ({**JUDGED, "judge_latency_s": {"a": -1}}, "line 2, field 'judge_latency_s.a'", "seconds >= 0"),
        ({}, "line 2, field 'judge_scores'", "every line or none"),
    ],
)
def test_the_reader_checks_judge_scores_naming_line_and_field(
    tmp_path: Path, second: dict[str, object], where: str, why: str
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(_line(1, **JUDGED)) + "\n" + json.dumps(_line(2, **second)) + "\n")
    with pytest.raises(SpecError, match=re.escape(f"p.jsonl: {where}") + ".*" + why):
        load_profile(path)


def _judged_profile(path: Path, n: int = 80, latency_s: float = 0.4) -> np.ndarray:
    """A two-tier profile with an LLM judge's ratings of the small tier's answers; returns those scores."""
    rng = np.random.default_rng(3)
    good = rng.random(n) < 0.6
    rating = np.where(good, rng.integers(6, 11, n), rng.integers(1, 7, n))  # a judge that mostly knows
    scores = (rating - 1) / 9
    rows = []
    for i in range(n):
        prompt = f"Question {i}: what is {i} plus {i * 3}?" + " Explain." * int(rng.integers(0, 4))
        rows.append(
            {
                "prompt": prompt,
                "scores": {"small": float(good[i]), "large": 1.0 if rng.random() < 0.9 else 0.0},
                "responses": {"small": f"It is {i * 4}. " * 3, "large": f"{i} + {i * 3} = {i * 4}. #### {i * 4}"},
                "judge": {"name": "strict", "model": "judge-m"},
                "judge_scores": {"small": float(scores[i]), "large": 1.0},
                "judge_latency_s": {"small": latency_s, "large": latency_s},
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return scores


def test_a_cascade_judged_by_an_llm_cuts_its_thresholds_on_the_recorded_scores(tmp_path: Path) -> None:
    from boute.optimize.evaluators import judge_delay_of, llm_judge_of

    judged = _judged_profile(tmp_path / "p.jsonl")
    prof = load_profile(tmp_path / "p.jsonl")
    qm = build_quality_model(prof, ["small", "large"], judge="llm")
    assert qm.info["verifier_path"] is None and llm_judge_of(qm) == "judge-m"
    assert judge_delay_of(qm) == pytest.approx(0.4)
    # the one fractions -> thresholds rule, given the recorded ratings as the cascade's scores
    on_ratings = QualityModel(qm.tiers, qm.test_scores, qm.test_index, qm.route_all, lambda: judged[:, None])
    v = judged[qm.test_index]
    for f in (0.2, 0.5, 0.8):
        r = qm.cascade([f, 1 - f])
        assert r.thresholds[0] == on_ratings.cascade([f, 1 - f]).thresholds[0]
        assert qm.cascade_thresholds([f, 1 - f])[0] == pytest.approx(r.thresholds[0])  # the N-tier path too
        accepted = v >= r.thresholds[0]  # the held-out queries' recorded ratings, counted against it
        assert r.shares[0] == pytest.approx(accepted.mean()) and r.judge_calls == 1.0
        assert r.mean == pytest.approx(np.where(accepted, qm.test_scores[:, 0], qm.test_scores[:, 1]).mean())


def test_asking_for_an_llm_judge_without_its_scores_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from boute.quality import quality_model_for
    from boute.specs import load_scenario
    from boute.specs.scenario import with_judge

    sc = with_judge(load_scenario("builtin:small-live"), "llm")
    with pytest.raises(SpecError, match=r"builtin:gsm8k: judge_scores: no LLM judge scores recorded"):
        quality_model_for(sc)
    out = ["-o", str(tmp_path / "plan.json"), "--db", f"sqlite:///{tmp_path / 'b.db'}"]
    got = run_cli(["optimize", "-s", "builtin:small-live", "--mode", "cascade", "--judge", "llm", *out], capsys)
    assert got.returncode == 2 and got.stderr.strip().count("\n") == 0 and "judge_scores" in got.stderr
    assert run_cli(["optimize", "--judge", "oracle", *out], capsys).stderr.startswith("error: --judge")
    assert not (tmp_path / "plan.json").exists()


def test_optimize_writes_a_plan_judged_by_the_llm_its_thresholds_were_cut_on(tmp_path: Path) -> None:
    from boute.optimize.evaluators import FastEvaluator, SimEvaluator
    from boute.optimize.plan_run import PlanRequest, make_plan
    from boute.optimize.settings import SearchSettings
    from boute.optimize.space import Candidate
    from boute.quality import quality_model_for
    from boute.quality.policy_quality import CascadeJudge
    from boute.scenarios import builtin_scenario_path
    from boute.specs import load_scenario
    from boute.specs.io import read_mapping

    judged = _judged_profile(tmp_path / "p.jsonl", latency_s=0.5)
    spec = read_mapping(builtin_scenario_path("small-live"))
    spec["quality"] = {"profile": "p.jsonl", "judge": "llm"}
    spec["tiers"] = [{**t, "quality_model": n} for t, n in zip(spec["tiers"], ("small", "large"), strict=True)]
    spec["targets"]["quality_floor"] = 0.7
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    sc = load_scenario(tmp_path / "s.yaml")

    search = SearchSettings(
        mode="cascade", strategy="random", evaluator="fast", max_evals=6, patience=None, confirm=False, workers=1
    )
    req = PlanRequest(
        out=tmp_path / "plan.json",
        scenario=str(tmp_path / "s.yaml"),
        db=f"sqlite:///{tmp_path / 'b.db'}",
        search=search,
    )
    plan = make_plan(req).plan
    r = plan.routing
    assert (r.judge, r.judge_model, r.verifier) == ("llm", "judge-m", None)
    qm = quality_model_for(sc)
    assert r.fractions is not None and r.thresholds is not None
    assert r.thresholds == pytest.approx(list(qm.cascade(r.fractions).thresholds))
    accepted = (judged[qm.test_index] >= r.thresholds[0]).mean()
    assert plan.predicted is not None and plan.predicted.tier_shares == pytest.approx([accepted, 1 - accepted])

    # the judge's recorded latency is what a judged hop costs, in the fast path and in the simulator: every
    # query is judged once in two tiers, so the mean latency is the verifier's delay's plus the difference
    c = Candidate(tuple(r.fractions), tuple(plan.deployment), 0.0)
    as_verifier = dataclasses.replace(qm, judge=CascadeJudge())  # the same scores, the verifier's delay
    for kind in (FastEvaluator, SimEvaluator):
        llm, verifier = kind(sc, "cascade"), kind(sc, "cascade", quality_model=as_verifier)
        assert (llm.judge_delay_s, verifier.judge_delay_s) == (pytest.approx(0.5), pytest.approx(0.002))
        slow, fast = llm(c).mean_latency_s, verifier(c).mean_latency_s
        assert slow is not None and fast is not None
        assert slow - fast == pytest.approx(0.5 - 0.002, rel=0.05), kind.name

    # the gateway judges it with that model only: another one at BOUTE_JUDGE_URL is refused in one line
    from router.routing import endpoint_judge

    judge = endpoint_judge(r, "http://127.0.0.1:9/v1", "judge-m", 1.0)
    assert isinstance(judge, LLMJudge) and judge.model == "judge-m"
    unset = endpoint_judge(r, "http://127.0.0.1:9/v1", None, 1.0)  # no BOUTE_JUDGE_MODEL: the plan's judge
    assert isinstance(unset, LLMJudge) and unset.model == "judge-m"
    env = {**os.environ, "BOUTE_PLAN": str(req.out), "BOUTE_JUDGE_URL": "http://127.0.0.1:9/v1"}
    argv = [sys.executable, "-m", "router", "--port", str(free_port())]
    refused = subprocess.run(
        argv, env=env | {"BOUTE_JUDGE_MODEL": "other"}, capture_output=True, text=True, timeout=SAFETY_S
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "routing.judge_model" in refused.stderr and "BOUTE_JUDGE_MODEL=judge-m" in refused.stderr
