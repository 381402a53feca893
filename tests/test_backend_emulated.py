"""The emulated backend: continuous-batching timing from the perf model, profile answers, SGLang API."""

from __future__ import annotations

import asyncio
import csv
import math
from collections.abc import Iterator

import httpx
import pytest

from backends.emulated.engine import Engine
from backends.emulated.launch import free_port
from backends.emulated.profile import ReplicaConfig, pieces
from boute.catalog import builtin_catalog
from boute.data import data_path
from boute.perf import replica_perf
from boute.sim.timing import DEFAULT_CHUNK_TOKENS
from tests.stack import serving_replicas
from tests.waits import until

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)

COLUMN = "gpt-4-1106-preview"


def _perf():
    cat = builtin_catalog()
    return replica_perf(cat.model("llama-3.1-8b"), cat.gpu("rtx-4090"))


class _Metered(Engine):
    """The engine with the modelled seconds of its iterations summed up: the tests assert the schedule the
    engine keeps, not the wall clock (which a busy machine stretches); the real-time pacing of that schedule
    is what ``make bench`` measures (bench_gateway runs the emulated replica at speedup 1)."""

    modelled_s = 0.0

    def iteration_time(self, admitted: list, decoding: list) -> float:
        t = super().iteration_time(admitted, decoding)
        self.modelled_s += t
        return t


async def _run_batch(n: int, tokens: int) -> _Metered:
    eng = _Metered(_perf(), speedup=1e6)  # the modelled schedule, without waiting it out
    eng.start()
    seqs = [eng.submit(["tok "] * tokens, 200, stream=False) for _ in range(n)]
    await asyncio.gather(*(s.done for s in seqs))
    await eng.stop()
    assert all(s.emitted == tokens for s in seqs)
    return eng


async def test_engine_slows_down_under_concurrency_but_batches() -> None:
    perf = _perf()
    one = await _run_batch(1, 64)
    many = await _run_batch(96, 64)
    # one prefill iteration (the first token) and 63 decode steps, each timed by the perf model
    model_one = float(perf.prefill_time(200)) + sum(float(perf.decode_step_time(1, 200 + k)) for k in range(1, 64))
    assert one.iterations == 64 and one.modelled_s == pytest.approx(model_one, rel=1e-6)
    # 96 concurrent sequences run together: their prompts prefilled in iterations of at most chunk_tokens
    # (40 prompts of 200 tokens in 8,192: three iterations, decoding nothing, as SGLang's scheduler), then the
    # 63 decode steps of one ...
    assert many.iterations == math.ceil(96 / (DEFAULT_CHUNK_TOKENS // 200)) + 63
    # ... each of them longer (a bigger batch), so every request is slower, but far from 96 x one
    assert many.modelled_s > 1.3 * one.modelled_s
    assert many.modelled_s < 96 * one.modelled_s / 4


async def test_engine_cancel_frees_the_slot() -> None:
    eng = Engine(_perf(), speedup=50)
    eng.start()
    seq = eng.submit(["x"] * 100_000, 10, stream=True)
    await seq.stream.get()
    eng.cancel(seq)
    await asyncio.wait_for(seq.done, 2)
    assert not eng.running and eng.kv_used == 0
    await eng.stop()


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cfg = ReplicaConfig(
        model="llama-3.1-8b",
        gpu="h100-sxm",
        port=free_port(),
        profile_model=COLUMN,
        speedup=50,
        enable_cache_report=True,
    )
    with serving_replicas([cfg], tmp_path_factory.mktemp("emu")) as url:
        yield url


def _known() -> tuple[str, str]:
    with open(data_path("builtin:gsm8k"), newline="", encoding="utf-8") as fh:
        row = next(csv.DictReader(fh))
    return row["prompt"], row[f"{COLUMN}_response"]


def test_known_prompt_gets_recorded_response_unknown_gets_filler(backend: str) -> None:
    prompt, recorded = _known()
    r = httpx.post(
        backend + "/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": prompt}]}
    )
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == recorded
    assert r.json()["usage"]["completion_tokens"] == len(pieces(recorded))
    r = httpx.post(backend + "/v1/completions", json={"model": "x", "prompt": "unknown prompt", "max_tokens": 17})
    body = r.json()
    assert body["usage"]["completion_tokens"] == 17 and body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["text"]) == 17 * 4


def test_sglang_native_endpoints(backend: str) -> None:
    prompt, recorded = _known()
    r = httpx.post(backend + "/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 5}})
    first5 = "".join(pieces(recorded)[:5])  # its first 5 tokens, by the simulator's counter
    assert r.json()["text"] == first5 and r.json()["meta_info"]["finish_reason"]["type"] == "length"
    assert httpx.get(backend + "/get_model_info").json()["model_path"] == "llama-3.1-8b"
    assert httpx.get(backend + "/health").status_code == 200
    with httpx.stream(
        "POST", backend + "/generate", json={"text": "q", "stream": True, "sampling_params": {"max_new_tokens": 3}}
    ) as s:
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) == 5


def test_bad_request_is_a_clean_400(backend: str) -> None:
    for body in (b"{", b'{"messages": 3}', b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}'):
        r = httpx.post(backend + "/v1/chat/completions", content=body)
        assert r.status_code == 400 and r.json()["object"] == "error" and r.json()["code"] == 400  # SGLang's shape


def test_client_disconnect_cancels_sequence(backend: str) -> None:
    with httpx.stream(
        "POST", backend + "/v1/completions", json={"model": "x", "prompt": "p", "max_tokens": 50_000, "stream": True}
    ) as s:
        it = s.iter_lines()
        next(it)
        assert httpx.get(backend + "/get_server_info").json()["running"] == 1
    until(lambda: httpx.get(backend + "/get_server_info").json()["running"] == 0, "the sequence cancelled")


def _idle(backend: str) -> bool:
    info = httpx.get(backend + "/get_server_info").json()
    return info["running"] == 0 and info["waiting"] == 0


def test_context_length_is_enforced_as_sglang_does(backend: str) -> None:
    """Requests that cannot fit the model's context get 400 with SGLang's message before any work (issue 28:
    ``max_tokens: 10**8`` took minutes of CPU and stalled every replica of the process)."""
    import openai

    context = httpx.get(backend + "/get_server_info").json()["context_length"]
    assert context == builtin_catalog().model("llama-3.1-8b").max_context == 131072
    client = openai.OpenAI(base_url=backend + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=10**8)
    assert too_many.value.status_code == 400
    assert "exceeds the model's maximum context length of 131072 tokens" in too_many.value.message
    with pytest.raises(openai.BadRequestError, match=r"The input \(131072 tokens\) is longer than the model's context"):
        client.completions.create(model="x", prompt="abcd" * context, max_tokens=1)
    r = httpx.post(backend + "/generate", json={"text": "q", "sampling_params": {"max_new_tokens": context}})
    assert r.status_code == 400 and "You requested a total of 131073 tokens" in r.json()["error"]["message"]
    assert _idle(backend)
    # without max_tokens the answer stops where the context does, as SGLang's does
    near = client.completions.create(model="x", prompt="abcd" * (context - 3))
    assert near.usage.completion_tokens == 3 and near.choices[0].finish_reason == "length"


def test_exactly_the_context_is_accepted_and_a_client_gone_stops_it(backend: str) -> None:
    """Prompt + max_tokens equal to the context is served (SGLang's bound is inclusive); the client that
    leaves, streamed or not, takes its sequence out of the batch (SGLang aborts it), so nothing keeps running."""
    from boute.workload.tokens import count_tokens

    prompt_tokens = int(count_tokens(["abcd"])[0])  # the replica's counter: the simulator's
    body = {"model": "x", "prompt": "abcd", "max_tokens": 131072 - prompt_tokens, "stream": True}
    with httpx.stream("POST", backend + "/v1/completions", json=body) as s:
        assert s.status_code == 200
        assert next(s.iter_lines()).startswith("data: {")
    with pytest.raises(httpx.ReadTimeout):  # non-streamed: the client gives up while the answer is made
        httpx.post(backend + "/v1/completions", json={**body, "stream": False}, timeout=httpx.Timeout(10, read=0.5))
    until(lambda: _idle(backend), "both sequences out of the batch")


# ---- the prefix cache (SGLang's radix cache, boute/perf/prefix_cache.py) --------------------------------------


def _words(tag: str, n: int) -> tuple[str, ...]:
    """``n`` distinct token pieces (a prompt no other test's shares)."""
    return tuple(f"{tag}{i} " for i in range(n))


async def _serve(eng: Engine, prompt: tuple[str, ...], answer: int = 1) -> tuple[int, float]:
    """One request through ``eng``, alone: (its cached tokens, the modelled seconds of its prefill iteration)."""
    before = len(eng.steps)
    seq = eng.submit(["tok "] * answer, len(prompt), stream=False, prompt=prompt)
    await seq.done
    return seq.cached, eng.steps[before]


class _Stepped(Engine):
    """The engine with the modelled seconds of each iteration recorded, in order."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[float] = []

    def iteration_time(self, admitted: list, decoding: list) -> float:
        t = super().iteration_time(admitted, decoding)
        self.steps.append(t)
        return t


async def test_a_repeated_prompt_hits_the_cache_and_prefills_only_the_rest() -> None:
    """SGLang reuses the longest cached prefix (at most prompt - 1 tokens: the last one is computed for the first
    answer token's logits) and prefills the rest; the perf model times that: the new tokens, attending to the
    cached ones. The TTFT falls by exactly what the perf model says the skipped prefill costs."""
    from boute.perf.physics import step_time

    perf = _perf()
    eng = _Stepped(perf, speedup=1e6)
    eng.start()
    prompt = _words("rep", 2000)
    first_hit, first_s = await _serve(eng, prompt)
    again_hit, again_s = await _serve(eng, prompt)
    await eng.stop()
    assert (first_hit, again_hit) == (0, 1999)
    assert first_s == pytest.approx(float(perf.prefill_time(2000)), rel=1e-9)  # no hit: the whole prompt
    # one new token attending to 1,999 cached ones (attention 2 u^2 + 4 u h, the cached KV read once)
    assert again_s == pytest.approx(float(step_time(perf.rates, perf.shape, 1, 1999, 1, seqs=1)), rel=1e-9)
    assert first_s - again_s > 0.9 * first_s  # nearly all of a 2,000-token prefill skipped
    assert (eng.cache.hit_tokens, eng.cache.lookup_tokens) == (1999, 4000)


async def test_a_cache_smaller_than_a_prompt_keeps_its_head_and_evicts_the_least_recent() -> None:
    """Eviction takes the least recently used leaves: a prompt longer than the cache keeps its leading blocks
    (its tail is the older end of its path), and a newer prompt pushes an older one out."""
    eng = _Stepped(_perf(), speedup=1e6, cache_tokens=500)
    eng.start()
    a, b = _words("a", 640), _words("b", 640)
    hits = [(await _serve(eng, p))[0] for p in (a, a, b, a)]
    await eng.stop()
    # 31 blocks of 16 fit in 500 tokens; b, newer, evicts all of a
    assert hits == [0, 496, 0, 0]
    assert eng.cache.held <= 500 and eng.cache.evicted_tokens >= 640 + 144


async def test_a_cancelled_request_caches_what_it_computed() -> None:
    """As SGLang's abort (the request ends through its finish path, ``release_kv_cache`` keeps what has KV): a
    request cancelled while running leaves its prompt and its answer but the last token in the tree; one
    cancelled while waiting computed nothing."""
    from boute.perf.prefix_cache import token_path

    eng = Engine(_perf(), speedup=50, max_running=1)
    eng.start()
    prompt, queued = _words("cut", 100), _words("queued", 100)
    seq = eng.submit(["x"] * 100_000, len(prompt), stream=True, prompt=prompt)
    behind = eng.submit(["x"], len(queued), stream=False, prompt=queued)  # waits: one running at most
    for _ in range(20):
        await seq.stream.get()
    eng.cancel(behind)
    eng.cancel(seq)
    await asyncio.wait_for(asyncio.gather(seq.done, behind.done), 30)
    await eng.stop()
    done = prompt + tuple(seq.pieces[: seq.emitted - 1])
    assert seq.emitted >= 20 and eng.cache.peek(token_path(done), len(done) + 1) == len(done)
    assert eng.cache.peek(token_path(done + ("x",)), len(done) + 2) < len(done) + 1  # not the last token
    assert eng.cache.peek(token_path(queued)) == 0 and behind.emitted == 0


def _cache_stats(backend: str) -> tuple[int, int]:
    info = httpx.get(backend + "/server_info").json()
    return info["cache_hit_tokens"], info["cache_lookup_tokens"]


def test_a_repeated_prompt_reports_its_cached_tokens_as_sglang(backend: str) -> None:
    """With --enable-cache-report, usage.prompt_tokens_details.cached_tokens is the cache's hit, in the whole
    answer and in a stream's usage chunk; /generate's meta_info.cached_tokens always; /server_info sums them."""
    import openai

    client = openai.OpenAI(base_url=backend + "/v1", api_key="unused", max_retries=0)
    prompt = " ".join(f"repeated{i}" for i in range(300))
    hit0, asked0 = _cache_stats(backend)
    first = client.completions.create(model="x", prompt=prompt, max_tokens=3)
    again = client.completions.create(model="x", prompt=prompt, max_tokens=3)
    n = first.usage.prompt_tokens
    assert n > 300 and again.usage.prompt_tokens == n
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == n - 1  # the prompt was cached whole: all but its last
    stream = client.completions.create(
        model="x", prompt=prompt, max_tokens=3, stream=True, stream_options={"include_usage": True}
    )
    usage = [c.usage for c in stream if c.usage is not None][-1]
    assert usage.prompt_tokens_details.cached_tokens == n - 1
    gen = httpx.post(backend + "/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 2}}).json()
    assert gen["meta_info"]["cached_tokens"] == n - 1
    assert gen["meta_info"]["cached_tokens_details"] == {"device": n - 1, "host": 0}  # SGLang's radix cache: device
    hit, asked = _cache_stats(backend)
    assert (hit - hit0, asked - asked0) == (3 * (n - 1), 4 * n)


def test_a_conversations_next_turn_hits_the_previous_prompt_and_answer(backend: str) -> None:
    """Turn 2 repeats turn 1's messages and its answer: SGLang cached turn 1 with its answer, so turn 2 hits at
    least all of it but a partial block (the cache's 16-token blocks) and the answer's last token (no KV)."""
    import openai

    client = openai.OpenAI(base_url=backend + "/v1", api_key="unused", max_retries=0)
    question, _ = _known()  # a recorded answer: its tokens, re-read in turn 2, are the ones generated
    turn1 = [{"role": "system", "content": "You are a careful tutor (conversation test)."}]
    turn1.append({"role": "user", "content": question})
    one = client.chat.completions.create(model="x", messages=turn1)
    answer = one.choices[0].message.content
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
    two = client.chat.completions.create(model="x", messages=turn2, max_tokens=4)
    seen = one.usage.prompt_tokens + one.usage.completion_tokens
    assert seen > 100
    assert seen - 16 <= two.usage.prompt_tokens_details.cached_tokens <= seen
    assert two.usage.prompt_tokens > seen  # the template around the answer and the new message


def test_chats_that_share_a_system_prompt_share_its_blocks(backend: str) -> None:
    """Two chats opening with one system prompt: the second hits the template and the system prompt, to the
    16-token block, and nothing of its own question."""
    import openai

    from backends.emulated.profile import CHAT_MESSAGE_TOKENS, count_tokens

    client = openai.OpenAI(base_url=backend + "/v1", api_key="unused", max_retries=0)
    system = " ".join(f"rule{i}" for i in range(120))
    hits = []
    for question in ("Alpha?", "Beta?"):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        r = client.chat.completions.create(model="x", messages=msgs, max_tokens=2)
        hits.append(r.usage.prompt_tokens_details.cached_tokens)
    # shared: the begin token, the system message (header, content, end) and the user's header
    shared = 1 + CHAT_MESSAGE_TOKENS + count_tokens(system) + 3
    assert hits == [0, shared // 16 * 16]
