"""``boute verify`` against slow real engines (issue 30): ``--max-tokens`` caps every replayed answer and says so,
``--timeout`` sets the per-request timeout. SGLang on two CPU cores decodes a few tokens/s, so unbounded GSM8K
answers outlived the fixed 120 s timeout and every request counted as failed. Emulated backends stand in here;
the run against real SGLang replicas is recorded in docs/sglang.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from boute.errors import BouteError
from boute.serving.replay_requests import build_requests, cap_max_tokens
from boute.serving.verify import Measured, compare
from boute.specs import load_scenario
from boute.specs.plan import Plan, Prediction

ROOT = Path(__file__).resolve().parents[1]
CPU_PLAN = ROOT / "examples" / "plan-sglang-cpu.json"


def _requests(ref: str | None, **kw: object):  # type: ignore[no-untyped-def]
    from boute.quality import quality_model_for
    from boute.quality.build import profile_for

    s = load_scenario(ref)
    return build_requests(s, profile_for(s), quality_model_for(s).test_index, duration_s=10, **kw)  # type: ignore[arg-type]


def test_max_tokens_caps_every_answer_and_counts_the_capped() -> None:
    """Recorded answers (GSM8K) ask for no length: the cap sets one on each, and the count says so."""
    req = _requests(None, max_tokens=8)
    bodies = [json.loads(b) for b in req.bodies]
    assert req.max_tokens == 8 and req.capped == len(bodies) > 0
    assert all(b["max_tokens"] == 8 for b in bodies)

    assert _requests(None).capped == 0 and _requests(None).max_tokens is None


@pytest.mark.parametrize(
    ("body", "cap", "want", "changed"),
    [({}, 8, 8, True), ({"max_tokens": 20}, 8, 8, True), ({"max_tokens": 5}, 8, 5, False), ({}, None, None, False)],
)
def test_the_cap_lowers_or_sets_a_length_never_raises_one(
    body: dict[str, int], cap: int | None, want: int | None, changed: bool
) -> None:
    """Lengths from the workload model (scenarios without recorded answers) are lowered only where above it."""
    assert cap_max_tokens(body, cap) is changed and body.get("max_tokens") == want


def test_max_tokens_below_one_is_a_user_error() -> None:
    with pytest.raises(BouteError, match="max_tokens must be >= 1, got 0"):
        _requests(None, max_tokens=0)


def _measured(p95: float) -> Measured:
    return Measured(10, 0, {"small": 0.5, "large": 0.5}, 0.8, 0.01, p95 / 2, p95, None, 0.1)


def test_a_capped_replay_reports_p95_instead_of_judging_it() -> None:
    """Capped answers are shorter than the ones the promise is about: P95 is shown, not judged, and a note says
    the answers were capped; shares and failures are still judged."""
    plan = Plan.model_validate(json.loads(CPU_PLAN.read_text())).model_copy(
        update={"predicted": Prediction(p95_latency_s=2.0)}
    )
    judged = compare(plan, _measured(10.0))
    p95 = next(c for c in judged.checks if c.name == "P95 (s)")
    assert not p95.ok and not judged.ok and not any("capped" in n for n in judged.notes)

    capped = compare(plan, _measured(10.0), capped_at=16)
    p95 = next(c for c in capped.checks if c.name == "P95 (s)")
    assert p95.ok and p95.tolerance == "reported (capped)" and p95.measured == 10.0
    assert any("answers capped at 16 tokens" in n for n in capped.notes)
    assert capped.ok  # shares 0.5/0.5 and 0 failed: within

    bad_share = Measured(10, 0, {"small": 1.0}, 0.8, 0.01, 1.0, 2.0, None, 0.1)
    assert not compare(plan, bad_share, capped_at=16).ok


def _verify(*extra: str) -> tuple[int, dict[str, object], str]:
    r = subprocess.run(
        [sys.executable, "-m", "boute", "verify", "--plan", str(CPU_PLAN), "--rate", "10", "--duration", "6", "--json"]
        + list(extra),
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        cwd=ROOT,
    )
    assert r.returncode in (0, 1), r.stderr[-2000:]
    return r.returncode, json.loads(r.stdout), r.stderr


@pytest.mark.slow  # ~25 s on 2 shared cores
@pytest.mark.timeout(200)  # two verify runs, each a gateway and two emulated replicas for ~6 s of traffic
def test_verify_cli_caps_answers_and_applies_its_timeout() -> None:
    """End to end on emulated backends: ``--max-tokens`` reaches every request (capped count, note, answers no
    longer the recorded ones) and ``--timeout`` reaches the load generator (a 1 ms timeout fails them all)."""
    _, out, _ = _verify("--max-tokens", "3", "--timeout", "300")
    m = out["measured"]
    assert isinstance(m, dict) and m["requests"] > 3 and m["failed"] == 0
    assert out["max_tokens"] == 3 and out["capped_requests"] == m["requests"] and out["timeout_s"] == 300
    assert any("answers capped at 3 tokens" in n for n in out["notes"])  # type: ignore[attr-defined]
    assert m["answers_match_profile"] is not None and m["answers_match_profile"] < 1.0  # 3 tokens, not the record

    code, out, _ = _verify("--timeout", "0.001")
    m = out["measured"]
    assert code == 1 and isinstance(m, dict) and m["failed"] == m["requests"] > 3
    assert out["max_tokens"] is None and out["capped_requests"] == 0


def test_the_text_report_says_answers_were_capped_and_shows_latency(capsys: pytest.CaptureFixture[str]) -> None:
    """The table names the cap and the measured P50/P95, even where the plan promises no latency to check."""
    from boute.cli.verify_cmd import _table

    plan = Plan.model_validate(json.loads(CPU_PLAN.read_text()))  # no prediction: no P95 check
    info = {"rate_rps": 2, "duration_s": 30, "gateway": "http://gw", "max_tokens": 8, "capped_requests": 10}
    _table(compare(plan, _measured(17.7), capped_at=8), {**info, "timeout_s": 300.0})
    out = capsys.readouterr().out
    assert "answers capped at 8 tokens: 10 of 10 requests" in out and "per-request timeout 300 s" in out
    assert "P50 8.85 s, P95 17.7 s" in out and "note: answers capped at 8 tokens" in out
