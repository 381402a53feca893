"""The reason for each route (issue 52 item 4): the ``x-boute-reason`` header and the access log's ``reason``
field, read through the official openai client from real gateways in front of emulated replicas, and the
summary ``boute verify --explain`` makes of them."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from boute.serving.explain import Explanation, explain_routes
from boute.serving.reason import HEADER, RouteReasons, fmt, parse_reason
from boute.specs.plan import Plan
from tests.judge_server import FakeJudge
from tests.stack import TEST_PLAN, Stack
from tests.waits import until


# ---- the format, without a gateway --------------------------------------------------------------
def test_each_reason_reads_back_as_written() -> None:
    tiers = ["small", "mid", "large"]
    cut = RouteReasons.by_thresholds(tiers, [0.25, 0.75])
    assert cut.preroute(0, 0.1) == "preroute; tier=small; by=threshold; score=0.1000; upto=0.2500"
    assert cut.preroute(1, 0.5) == "preroute; tier=mid; by=threshold; score=0.5000; above=0.2500; upto=0.7500"
    assert cut.preroute(2, 0.9) == "preroute; tier=large; by=threshold; score=0.9000; above=0.7500"
    mid = parse_reason(cut.preroute(1, 0.5))
    assert (mid.how, mid.tier, mid.by, mid.score, mid.above, mid.upto) == (
        "preroute",
        "mid",
        "threshold",
        0.5,
        0.25,
        0.75,
    )
    assert mid.consistent() and not parse_reason(cut.preroute(1, 0.8)).consistent()  # 0.8 is past mid's 0.75
    # a tier that takes nothing has an infinite threshold: written and read as inf
    never = RouteReasons.by_thresholds(["small", "large"], [math.inf])
    assert parse_reason(never.preroute(0, 0.99)).upto == math.inf
    priced = RouteReasons.by_prices(tiers, [0.0, 0.05, math.inf], scored=True)
    r = parse_reason(priced.preroute(1, 0.4))
    assert r.by == "prices" and r.score == 0.4 and r.prices == (0.0, 0.05, math.inf)
    unscored = RouteReasons.by_prices(tiers, [0.0, 0.05, 0.1], scored=False).preroute(2, 2.0)
    assert unscored == "preroute; tier=large; by=prices; prices=0.0000,0.0500,0.1000"
    assert parse_reason(RouteReasons.one_tier(tiers).preroute(2, 0.0)).by == "one-tier"
    assert parse_reason(cut.forced(1)) == parse_reason("forced; tier=mid")
    c = RouteReasons.cascade(tiers, [0.5, 0.6])
    text = "cascade" + c.escalated(0, 0.1, failed=False) + c.escalated(1, 0.0, failed=True) + c.final(2)
    assert text == "cascade; small=escalated 0.1000<0.5000; mid=judge-failed; large=final"
    hops = parse_reason(text).hops
    assert [(h.tier, h.verdict, h.score, h.threshold) for h in hops] == [
        ("small", "escalated", 0.1, 0.5),
        ("mid", "judge-failed", None, None),
        ("large", "final", None, None),
    ]
    assert parse_reason("cascade" + c.unjudged(0, 503)).hops[0].status == 503
    assert not parse_reason("cascade; small=accepted 0.4000>=0.5000").consistent()  # a verdict against its figures
    assert not parse_reason("cascade; small=escalated 0.1000<0.5000").consistent()  # escalated to nowhere
    for bad in ("routed; tier=x", "preroute; by=threshold", "cascade; small=maybe", "preroute; tier=a; score=x"):
        with pytest.raises(ValueError, match=HEADER):
            parse_reason(bad)


async def test_a_failed_judgement_is_told_from_a_zero_score() -> None:
    """A verifier that cannot score an answer gives 0.0 (escalate) typed :class:`JudgeFailed`; a real 0.0 is a
    plain float: the gateway's reason says ``judge-failed`` only for the first."""
    import numpy as np

    from boute.quality.judges import JudgeFailed, VerifierJudge

    class Verifier:
        def score(self, prompts, responses, cache=None):
            if any("boom" in r for r in responses):
                raise RuntimeError("cannot embed")
            return np.zeros(len(prompts))

    judge = VerifierJudge(Verifier())  # type: ignore[arg-type]
    failed, zero = await judge.ajudge("q", "boom"), await judge.ajudge("q", "fine")
    assert failed == zero == 0.0 and type(failed) is JudgeFailed and type(zero) is not JudgeFailed
    assert judge.failures == 1


# ---- through the gateway ------------------------------------------------------------------------
def _plan_file(stack: Stack, name: str, routing: dict[str, Any]) -> str:
    path = stack.workdir / f"{name}.json"
    path.write_text(json.dumps({**TEST_PLAN, "routing": routing}))
    return str(path)


def _log(url: str, stack: Stack) -> Path:
    return stack.workdir / f"gateway-{url.rsplit(':', 1)[1]}.log"


@pytest.mark.timeout(120)  # starts a gateway
def test_a_preroute_reason_names_the_score_and_the_thresholds_that_chose_the_tier(stack: Stack) -> None:
    """TEST_PLAN pre-routes by the prompt-length CDF cut 50/50: each answer's reason carries the score the
    gateway computed for its prompt and the threshold it was compared with, and they agree with the tier."""
    from boute.quality import load_profile
    from router.routing import RoutePolicy

    url, _ = stack.gateway(BOUTE_ACCESS_LOG="1")
    local = RoutePolicy(Plan.model_validate(TEST_PLAN))  # the same compiled routing, here
    (threshold,) = local.thresholds
    prompts = [p for p in load_profile("builtin:gsm8k").prompts[:400:10]]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    answered, reasons = [], []
    for p in prompts:
        raw = client.chat.completions.with_raw_response.create(
            model="boute", messages=[{"role": "user", "content": p}], max_tokens=2
        )
        answered.append(raw.headers["x-boute-tier"])
        reasons.append(raw.headers[HEADER])
        r = parse_reason(raw.headers[HEADER])
        assert (r.how, r.by, r.tier) == ("preroute", "threshold", answered[-1])
        assert fmt(local.score_sync(p)) == f"{r.score:.4f}"  # the score of this prompt, not another's
        assert (r.upto if r.tier == "small" else r.above) == float(fmt(threshold)) and r.consistent()
    assert set(answered) == {"small", "large"}  # both sides of the threshold were exercised
    # the request's model forces a tier: the reason says so, with no score
    forced = client.completions.with_raw_response.create(model="router-large", prompt="hi", max_tokens=2)
    assert forced.headers[HEADER] == "forced; tier=large"
    # a stream carries its reason with its headers, before the first token
    with client.chat.completions.with_streaming_response.create(
        model="boute", messages=[{"role": "user", "content": prompts[0]}], max_tokens=4, stream=True
    ) as s:
        assert s.headers[HEADER] == reasons[0] and s.headers["x-boute-tier"] == answered[0]
        assert sum(1 for line in s.iter_lines() if line.startswith("data: {")) >= 4
    # the access log repeats each reason, one logfmt line per request
    log = _log(url, stack)
    sent = len(prompts) + 2
    until(lambda: log.read_text().count(" reason=") >= sent, "an access line per request")
    lines = [ln for ln in log.read_text().splitlines() if " reason=" in ln]
    logged = [re.search(r'reason="([^"]*)"', ln).group(1) for ln in lines]  # type: ignore[union-attr]
    assert logged[: len(prompts)] == reasons and logged[len(prompts)] == "forced; tier=large"
    assert all("kind=chat status=200 tier=" in ln for ln in lines[: len(prompts)])
    # what verify --explain makes of them: per tier, the scores on its side of the one threshold
    why = explain_routes(["small", "large"], answered, reasons)
    assert (why.explained, why.unexplained, why.inconsistent) == (len(prompts), 0, 0)
    small, large = why.tiers
    assert small.requests == answered.count("small") and small.how == {"threshold": small.requests}
    assert small.score_max is not None and small.score_max <= float(fmt(threshold)) == small.upto[0]
    assert large.score_min is not None and large.score_min >= large.above[0] and not why.hops


@pytest.mark.timeout(120)  # starts a gateway
def test_a_plan_that_loads_one_tier_says_so(stack: Stack) -> None:
    url, _ = stack.gateway(BOUTE_PLAN=_plan_file(stack, "one", {"tiers": ["small", "large"], "fractions": [0, 1]}))
    r = httpx.post(
        url + "/v1/chat/completions", json={"model": "boute", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 200 and r.headers[HEADER] == "preroute; tier=large; by=one-tier"


@pytest.mark.timeout(120)  # starts a gateway and a judge
def test_a_cascade_reason_gives_each_hops_judge_score_and_verdict(stack: Stack, judge_url: str) -> None:
    """An 'llm' judge rates "hi" 9/10 ((9-1)/9 = 0.8889, accepted at 0.5), anything else 2/10 (0.1111:
    escalated), and gives no rating for "unratable" (judge failed: escalated)."""

    def rate(content: str) -> str:
        question = content.split("[Question]\n", 1)[1].split("\n\n[The Start", 1)[0]
        return "no rating" if "unratable" in question else "Rating: [[9]]" if question == "hi" else "[[2]]"

    FakeJudge.reply = rate
    routing = {"mode": "cascade", "tiers": ["small", "large"], "fractions": [0.7, 0.3], "judge": "llm"}
    url, _ = stack.gateway(
        BOUTE_PLAN=_plan_file(stack, "cascade", routing | {"thresholds": [0.5]}), BOUTE_JUDGE_URL=judge_url
    )
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    want = {
        "hi": "cascade; small=accepted 0.8889>=0.5000",
        "why": "cascade; small=escalated 0.1111<0.5000; large=final",
        "unratable": "cascade; small=judge-failed; large=final",
    }
    answered, reasons = [], []
    for prompt, expected in want.items():
        raw = client.chat.completions.with_raw_response.create(
            model="boute", messages=[{"role": "user", "content": prompt}], max_tokens=3
        )
        assert raw.headers[HEADER] == expected and parse_reason(expected).tier == raw.headers["x-boute-tier"]
        answered.append(raw.headers["x-boute-tier"])
        reasons.append(raw.headers[HEADER])
    # streamed: the escalated request's last hop streams; its reason went out with the headers
    with client.chat.completions.with_streaming_response.create(
        model="boute", messages=[{"role": "user", "content": "why"}], max_tokens=3, stream=True
    ) as s:
        assert s.headers[HEADER] == want["why"] and s.headers["x-boute-tier"] == "large"
        assert any(line.startswith("data: {") for line in s.iter_lines())
    why = explain_routes(["small", "large"], answered, reasons)
    assert why.inconsistent == 0 and [(t.tier, t.requests, t.how) for t in why.tiers] == [
        ("small", 1, {"cascade": 1}),
        ("large", 2, {"cascade": 2}),
    ]
    first, last = why.hops
    assert (first.tier, first.reached, first.threshold) == ("small", 3, 0.5)
    assert first.verdicts == {"accepted": 1, "escalated": 1, "judge-failed": 1}
    assert (first.judge_p10, first.judge_p90) == (0.1111, 0.8889)  # failed judgements carry no score
    assert (last.tier, last.reached, last.verdicts) == ("large", 2, {"final": 2})


# ---- verify --explain's summary -----------------------------------------------------------------
def test_the_explanation_counts_what_it_cannot_read_and_what_contradicts_the_plan(capsys) -> None:
    from boute.cli.verify_cmd import _explain_table

    reasons = [
        "preroute; tier=small; by=threshold; score=0.2000; upto=0.5000",
        "preroute; tier=large; by=threshold; score=0.7000; above=0.5000",
        "preroute; tier=large; by=threshold; score=0.3000; above=0.5000",  # below its tier's threshold
        "preroute; tier=small; by=threshold; score=0.1000; upto=0.5000",  # but the large tier answered
        None,  # a gateway without the header
        "garbled",
        "forced; tier=large",
    ]
    answered = ["small", "large", "large", "large", "small", "small", "large"]
    why = explain_routes(["small", "large"], [*answered, None], [*reasons, "never answered"])
    assert isinstance(why, Explanation) and (why.explained, why.unexplained, why.inconsistent) == (5, 2, 2)
    assert [(t.tier, t.requests, t.how) for t in why.tiers] == [
        ("small", 2, {"threshold": 2}),
        ("large", 3, {"threshold": 2, "forced": 1}),
    ]
    assert (why.tiers[0].score_min, why.tiers[0].score_max, why.tiers[0].upto) == (0.1, 0.2, [0.5])
    assert json.loads(json.dumps(why.to_dict()))["tiers"][1]["above"] == [0.5]
    _explain_table(why)
    out = capsys.readouterr().out
    assert "x-boute-reason of 5 answers" in out and "2 answers carried no readable reason" in out
    assert re.search(r"small\s+2\s+threshold 2\s+0\.1000-0\.2000\s+<= 0\.5000", out), out
    assert "2 reasons contradict" in out


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("preroute; tier=large; by=one-tier", False),
        ("a\tb", False),
        ("Äpfel \xa0", False),
        ("a\nb", True),
        ("a\x7f", True),
    ],
)
async def test_the_fast_path_refuses_the_header_values_it_always_refused(value: str, refused: bool) -> None:
    """Header values are checked printable first (the reason's framing cost, docs/router.md), then by the regex:
    the same values are refused as before (control characters), and a tab or non-ASCII text still goes out."""
    from types import SimpleNamespace

    from router.http.protocol import FastRequest, GatewayHttpProtocol
    from router.http.reply import Reply

    sent: list[bytes] = []
    transport = SimpleNamespace(write=sent.append, is_closing=lambda: False, close=lambda: None)
    fake = SimpleNamespace(
        transport=transport, server_state=SimpleNamespace(default_headers=[]), on_response_complete=lambda: None
    )
    write = GatewayHttpProtocol._write(fake, FastRequest("chat", True), Reply(200, b"{}", {HEADER: value}))  # type: ignore[arg-type]
    if refused:
        with pytest.raises(ValueError, match="invalid value"):
            await write
        assert not sent
    else:
        await write
        assert f"{HEADER}: {value}\r\n".encode("latin-1") in sent[0]
