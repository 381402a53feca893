"""A streamed cascade end to end (issue 29 item 4): the official openai client streaming through a real gateway
in front of emulated replicas, with an LLM judge over real HTTP.

A cascade cannot stream tier 0's answer as it is generated: the judge must read the whole of it first, and an
answer the judge rejects must never reach the client. So the client's time to first token is the time the
*accepted* answer starts reaching it, which for an escalated request is after tier 0's whole generation and
the judge's verdict. These tests hold the gateway to that by events, never by wall-clock guesses: the judge
(in this process) notes when it receives tier 0's whole answer, the client notes when its first token
arrives, and causality orders the two only if the gateway held the stream until the verdict.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.judge_server import FakeJudge, serve_judge
from tests.stack import TEST_PLAN, Stack

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)

#: GSM8K prompts: the emulated replicas answer them with each tier's own recorded answer, so the two tiers'
#: texts differ and a mixed stream would show; the judge's reply is set per prompt
ACCEPTED, ESCALATED, JUDGE_DOWN = 0, 1, 2


@dataclass
class Judged:
    """What the judge saw, per prompt: its request's text (tier 0's whole answer inside) and when it came."""

    content: dict[str, str] = field(default_factory=dict)
    at: dict[str, float] = field(default_factory=dict)


@dataclass
class Cascade:
    """A cascade gateway on the module's stack, its judge's record, and the prompts by role."""

    url: str
    judged: Judged
    prompts: list[str]


@pytest.fixture(scope="module")
def cascade(stack: Stack) -> Iterator[Cascade]:
    """A gateway serving TEST_PLAN's replicas as a two-tier cascade judged by an LLM judge over HTTP, which
    rates the ACCEPTED prompt's answer 9/10 and every other 2/10 (threshold 0.5: escalate)."""
    from boute.quality.profiles import load_profile

    prompts = list(load_profile("builtin:gsm8k").prompts[:3])
    judged = Judged()

    def rate(content: str) -> str:
        prompt = next(p for p in prompts if f"[Question]\n{p}\n" in content)
        judged.content[prompt], judged.at[prompt] = content, time.monotonic()
        return "Rating: [[9]]" if prompt == prompts[ACCEPTED] else "Rating: [[2]]"

    plan = {
        **TEST_PLAN,
        "routing": {"mode": "cascade", "tiers": ["small", "large"], "fractions": [0.5, 0.5]}
        | {"judge": "llm", "thresholds": [0.5]},
    }
    plan_file = stack.workdir / "cascade-stream.json"
    plan_file.write_text(json.dumps(plan))
    with serve_judge() as judge_url:
        FakeJudge.reply = rate
        url, _ = stack.gateway(BOUTE_PLAN=str(plan_file), BOUTE_JUDGE_URL=judge_url)
        yield Cascade(url, judged, prompts)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _answer_of(url: str, tier: str, prompt: str) -> str:
    """The tier's own answer to ``prompt``, forced to that tier and not streamed (what a streamed cascade
    answer must equal, whole)."""
    chat = _client(url).chat.completions.create(model=f"router-{tier}", messages=[{"role": "user", "content": prompt}])
    text = chat.choices[0].message.content
    assert text
    return text


@dataclass
class Streamed:
    """A streamed chat completion as the client saw it."""

    text: str
    headers: httpx.Headers
    sent: float  # time.monotonic() before the request
    first_token: float  # time.monotonic() when the first content arrived
    usage: int | None  # completion tokens of the usage chunk, when one came


def _stream(url: str, prompt: str) -> Streamed:
    """Ask for a streamed answer (with the usage chunk, as stream_options asks) and time its first token."""
    sent = time.monotonic()
    raw = _client(url).chat.completions.with_raw_response.create(
        model="boute",
        messages=[{"role": "user", "content": prompt}],
        stream=True,
        stream_options={"include_usage": True},
    )
    parts: list[str] = []
    first = 0.0
    usage = None
    for chunk in raw.parse():
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for c in chunk.choices:
            if c.delta.content:
                first = first or time.monotonic()
                parts.append(c.delta.content)
    assert first, "no content streamed"
    return Streamed("".join(parts), raw.headers, sent, first, usage)


def _metric(url: str, name: str) -> float:
    """One unlabelled sample of the gateway's /metrics (0.0 before it is first counted)."""
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return sample.value
    return 0.0


def _ttft_count(url: str, tier: str) -> float:
    """``boute_ttft_seconds_count{tier}`` from the gateway's /metrics."""
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == "boute_ttft_seconds_count" and sample.labels.get("tier") == tier:
                return sample.value
    return 0.0


def test_an_accepted_first_answer_is_streamed_whole_from_tier_0(cascade: Cascade) -> None:
    """(a) The judge accepts tier 0's answer: the client gets exactly that answer as SSE, tier 0 named, one hop,
    and the usage chunk it asked for (as a streamed answer from the replica itself would carry)."""
    prompt = cascade.prompts[ACCEPTED]
    small = _answer_of(cascade.url, "small", prompt)
    got = _stream(cascade.url, prompt)
    assert got.headers["content-type"].startswith("text/event-stream")
    assert got.headers["x-boute-tier"] == "small" and "x-boute-hops" not in got.headers
    assert got.text == small
    assert got.usage is not None and got.usage > 0
    assert small in cascade.judged.content[prompt]  # the judge read the whole answer it accepted
    # the gateway reports the time to first token its client got: after the judge, never more than the client saw
    assert 0 < float(got.headers["x-boute-ttft-ms"]) / 1e3 <= got.first_token - got.sent


def test_an_escalated_answer_is_the_next_tier_s_alone_and_its_first_token_waits_for_the_verdict(
    cascade: Cascade,
) -> None:
    """(b) The judge rejects tier 0's answer: the client gets tier 1's answer streamed, none of tier 0's text.
    (c) Its first token arrives only after the judge received tier 0's *whole* answer, so the client's time to
    first token covers tier 0's whole generation and the verdict: the gateway leaks no token before judging."""
    prompt = cascade.prompts[ESCALATED]
    small, large = _answer_of(cascade.url, "small", prompt), _answer_of(cascade.url, "large", prompt)
    assert small != large and small not in large  # the recorded answers tell the tiers apart
    got = _stream(cascade.url, prompt)
    assert got.headers["x-boute-tier"] == "large" and got.headers["x-boute-hops"] == "2"
    assert got.text == large
    assert got.usage is not None and got.usage > 0
    assert f"\n{small}\n" in cascade.judged.content[prompt]  # tier 0 had finished its answer when judged
    judged_at = cascade.judged.at[prompt]
    ttft = got.first_token - got.sent
    assert got.sent < judged_at < got.first_token, (
        f"first token {ttft * 1e3:.1f} ms after sending, the judge had tier 0's answer at "
        f"{(judged_at - got.sent) * 1e3:.1f} ms"
    )
    # reported as the client got it (header and /metrics), within what the client measured
    assert 0 < float(got.headers["x-boute-ttft-ms"]) / 1e3 <= ttft
    assert _ttft_count(cascade.url, "large") >= 1


def test_a_judge_failure_on_a_streamed_request_escalates_and_is_counted(cascade: Cascade) -> None:
    """(d) The judge answers HTTP 500: tier 0's answer is not trusted, the request escalates and streams tier
    1's answer, and /metrics counts the judge failure and the escalation."""
    prompt = cascade.prompts[JUDGE_DOWN]
    large = _answer_of(cascade.url, "large", prompt)
    failures = _metric(cascade.url, "boute_judge_failures")
    escalations = _metric(cascade.url, "boute_escalations_total")
    FakeJudge.status = 500
    try:
        got = _stream(cascade.url, prompt)
    finally:
        FakeJudge.status = 200
    assert got.headers["x-boute-tier"] == "large" and got.headers["x-boute-hops"] == "2"
    assert got.text == large
    assert _metric(cascade.url, "boute_judge_failures") == failures + 1
    assert _metric(cascade.url, "boute_escalations_total") == escalations + 1
