"""Gateway building blocks without servers: settings, policy thresholds, balancing, circuit breaker."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from boute.catalog import builtin_catalog
from boute.errors import SpecError
from boute.quality.router_kinds import LengthScorer
from boute.quality.shares import thresholds_for_fractions
from boute.serving import BackendSpec
from boute.serving.weights import REFERENCE_LENGTHS
from boute.sim.weights import replica_capacity
from boute.specs.plan import Plan
from router.balancer import Balancer
from router.config import Settings
from router.errors import BadRequest, UnknownModel
from router.openai_io import CHAT, completion_as_sse, parse_request
from router.routing import RoutePolicy
from tests.stack import TEST_PLAN


def test_settings_env_then_overrides() -> None:
    s = Settings.from_env({"BOUTE_MAX_INFLIGHT": "7", "BOUTE_REDIS_URL": "redis://x:1/0"}, redis_url=None, retries=5)
    assert (s.max_inflight, s.redis_url, s.retries) == (7, "redis://x:1/0", 5)
    with pytest.raises(ValueError):
        Settings.from_env({"BOUTE_MAX_INFLIGHT": "-1"})


def test_import_router_leaves_the_quality_package_unloaded() -> None:
    """The gateway's settings take the judge timeout from ``boute.serving.timeouts``: a bare ``import router``
    once loaded ``boute.quality`` (~0.3 s) for that one number. The profiler's default is the same number."""
    from boute.serving.timeouts import JUDGE_TIMEOUT_S

    code = "import sys, router; print(sorted(m for m in ('boute.quality', 'numpy') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert res.stdout.strip() == "[]"
    assert Settings().judge_timeout_s == JUDGE_TIMEOUT_S


def test_fraction_thresholds_split_reference_as_planned() -> None:
    scores = np.random.default_rng(0).random(10_000)
    th = thresholds_for_fractions(scores, [0.2, 0.5, 0.3])
    tiers = np.searchsorted(th, scores, side="left")
    assert np.allclose(np.bincount(tiers) / len(scores), [0.2, 0.5, 0.3], atol=0.01)


def _cascade(**routing: object) -> dict[str, object]:
    r = {"mode": "cascade", "tiers": ["small", "large"], "fractions": [0.7, 0.3]} | routing
    return {**TEST_PLAN, "routing": r}


def test_a_cascade_is_served_only_with_the_judge_its_thresholds_were_cut_for() -> None:
    """No stand-in judge: a cascade naming none is refused in one line, as is an 'llm' judge with no endpoint
    and a verifier file that is not there; the spec itself refuses a judge without thresholds."""
    with pytest.raises(SpecError) as e:
        RoutePolicy(Plan.model_validate(_cascade()), file="p.json")
    assert "routing.judge" in str(e.value) and "no stand-in" in str(e.value)
    with pytest.raises(SpecError, match="BOUTE_JUDGE_URL"):
        RoutePolicy(Plan.model_validate(_cascade(judge="llm", thresholds=[0.5])), file="p.json")
    with pytest.raises(SpecError) as e:
        RoutePolicy(Plan.model_validate(_cascade(judge="verifier", verifier="nope.npz", thresholds=[0.5])))
    assert "routing.verifier" in str(e.value) and "not found" in str(e.value)
    for bad, why in (
        ({"judge": "llm"}, "needs routing.thresholds"),
        ({"judge": "verifier", "thresholds": [0.5]}, "needs routing.verifier"),
        ({"verifier": "v.npz", "thresholds": [0.5]}, "only read with routing.judge 'verifier'"),
    ):
        with pytest.raises(ValueError, match=why):
            Plan.model_validate(_cascade(**bad))
    with pytest.raises(ValueError, match="cascades only"):
        Plan.model_validate({**TEST_PLAN, "routing": TEST_PLAN["routing"] | {"judge": "llm", "thresholds": [0.5]}})


async def test_an_llm_judge_thresholds_each_hop_and_counts_what_it_could_not_rate() -> None:
    """The plan's thresholds decide on the judge's score; a judge that fails escalates and is counted."""

    class Judge:
        failures = 0

        async def ajudge(self, prompt: str, response: str) -> float:
            return 0.9 if prompt == "easy" else 0.1

    policy = RoutePolicy(Plan.model_validate(_cascade(judge="llm", thresholds=[0.5])), judge=Judge())
    assert policy.thresholds == [0.5] and policy.judge is not None
    assert policy.accepts(0, await policy.judge.ajudge("easy", "")) and not policy.accepts(0, 0.1)
    assert policy.accepts(1, 0.0)  # the last tier's answer is always kept


def test_length_policy_routes_long_prompts_to_large_tier_and_forces_by_name() -> None:
    policy = RoutePolicy(Plan.model_validate(TEST_PLAN))
    assert policy.tier_for_score(policy.score_sync("hi")) == 0
    assert policy.tier_for_score(policy.score_sync("x" * 5000)) == 1
    assert policy.resolve_model("router-large") == 1 and policy.resolve_model("small") == 0
    assert policy.resolve_model("boute") is None
    with pytest.raises(UnknownModel, match="unknown model 'gpt-9'"):
        policy.resolve_model("gpt-9")
    assert LengthScorer(["a", "bbb"]).score(["bb"]).tolist() == [0.5]


def test_shedding_bounds_come_from_the_plans_rate_and_cap() -> None:
    """Little's law per tier: planned rate x share x P95 cap over the tier's replicas, never below 256 per
    replica; a plan without its scenario keeps 256; cascades count every query a tier sees."""
    from router.admission import planned_inflight

    base = {
        "routing": {
            "tiers": ["small", "large"],
            "fractions": [0.82, 0.18],
            "scorer": "length",
            "reference": "builtin:gsm8k",
        },
        "deployment": [
            {"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 1, "tp": 2},
            {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 3, "tp": 4},
        ],
    }
    spec = {"workload": {"rate_rps": 150}, "targets": {"p95_latency_s": 15}}
    plan = Plan.model_validate(base | {"scenario_spec": spec})
    assert planned_inflight(plan) == {"small": 1845, "large": 256}  # 150 x 0.82 x 15; 150 x 0.18 x 15 / 3 = 135
    assert RoutePolicy(plan).inflight_total == 1845 + 3 * 256
    assert planned_inflight(Plan.model_validate(base)) == {"small": 256, "large": 256}
    cascade = base | {"routing": base["routing"] | {"mode": "cascade"}, "scenario_spec": spec}
    assert planned_inflight(Plan.model_validate(cascade))["large"] == 256  # 150 x 0.18 x 15 / 3: still under
    spec_busy = {"workload": {"rate_rps": 600}, "targets": {"p95_latency_s": 15}}
    busy = Plan.model_validate(cascade | {"scenario_spec": spec_busy})
    assert planned_inflight(busy) == {"small": 9000, "large": 540}  # every query visits small; 18% reach large


def _balancer(**kw: float) -> Balancer:
    bal = Balancer(Settings(cooldown_s=kw.get("cooldown_s", 60.0), cb_failures=3))
    specs = [
        BackendSpec(url="http://a:1", tier="small", model="llama-3.1-8b", gpu="h100-sxm"),
        BackendSpec(url="http://b:1", tier="small", model="llama-3.1-8b", gpu="rtx-4090"),
    ]
    bal.configure(Plan.model_validate(TEST_PLAN), specs)
    return bal


def test_capacity_weights_and_least_outstanding() -> None:
    cat = builtin_catalog()
    fast_cap = replica_capacity(cat, ("llama-3.1-8b", "h100-sxm", 1, 1, "bf16"), REFERENCE_LENGTHS)
    slow_cap = replica_capacity(cat, ("llama-3.1-8b", "rtx-4090", 1, 1, "bf16"), REFERENCE_LENGTHS)
    assert fast_cap is not None and fast_cap > (slow_cap or 0)
    bal = _balancer()
    fast, slow = bal.pools["small"]
    counts = {fast.id: 0, slow.id: 0}
    for _ in range(40):  # requests held open: load spreads in proportion to capacity
        r = bal.pick("small")
        r.outstanding += 1
        counts[r.id] += 1
    ratio = counts[fast.id] / counts[slow.id]
    assert ratio == pytest.approx(fast.weight / slow.weight, rel=0.25)


def test_circuit_breaker_opens_after_threshold_and_half_opens() -> None:
    """No sleeping through the cooldown (a busy machine can stall a process past a short one between two
    lines): the cooldown is long, and its end is reached by moving ``open_until`` into the past."""
    bal = _balancer(cooldown_s=60)
    fast, slow = bal.pools["small"]
    bal.failure(fast)
    bal.failure(fast)
    assert fast.available(time.monotonic())
    bal.failure(fast)
    assert not fast.available(time.monotonic()) and fast.available(fast.open_until)  # out for the cooldown
    assert all(bal.pick("small") is slow for _ in range(5))
    fast.open_until = time.monotonic() - 1  # the cooldown is over
    assert fast.available(time.monotonic())  # half-open: one more failure re-opens at once
    bal.failure(fast)
    assert not fast.available(time.monotonic())
    fast.open_until = time.monotonic() - 1
    bal.success(fast)
    bal.failure(fast)
    assert fast.available(time.monotonic())  # closed again: one failure is tolerated
    bal.failure(slow, refused=True)  # a refused connection trips at once
    assert not slow.available(time.monotonic())


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"{", "not valid JSON"),
        (b"[1]", "JSON object"),
        (b'{"model": "boute"}', "messages"),
        (b'{"model": "boute", "messages": [{"content": "x"}]}', "role"),
        (b'{"model": 3, "messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
    ],
)
def test_parse_rejects_malformed_chat(raw: bytes, fragment: str) -> None:
    with pytest.raises(BadRequest, match=fragment):
        parse_request(raw, CHAT)


def test_parse_and_sse_roundtrip() -> None:
    body, prompt, stream, chars = parse_request(
        b'{"model":"boute","stream":true,"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"q"}]}]}',
        CHAT,
    )
    assert (prompt, stream, chars) == ("q", True, 2)  # every message's text counts toward the input
    sse = completion_as_sse(
        b'{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}', CHAT
    )
    assert b'"delta":{"role":"assistant","content":"hi"}' in sse and sse.endswith(b"data: [DONE]\n\n")


class _StaticLike:
    """Stands in for a static-embedding router: batchable ``score``; one poisoned prompt fails a batch."""

    embedder_kind = "static"
    cheap = True

    def __init__(self) -> None:
        self.calls: list[int] = []

    def score(self, prompts: list[str]) -> np.ndarray:
        self.calls.append(len(prompts))
        if "poison" in prompts:
            raise ValueError("bad prompt")
        return np.array([min(1.0, len(p) / 100) for p in prompts])

    def score_one(self, prompt: str) -> float:
        return float(self.score([prompt])[0])


async def test_static_router_prompts_are_scored_in_one_batch_per_loop_turn() -> None:
    import asyncio

    scorer = _StaticLike()
    policy = RoutePolicy(Plan.model_validate(TEST_PLAN), scorer=scorer)
    assert policy.scoring == "batch" and policy.cheap
    assert RoutePolicy(Plan.model_validate(TEST_PLAN)).scoring == "inline"  # the length CDF: no batching
    scorer.calls.clear()
    prompts = ["a" * n for n in (5, 50, 95)]
    got = await asyncio.gather(*(policy.score_batched(p) for p in prompts))
    assert got == [0.05, 0.5, 0.95] and scorer.calls == [3]
    # one prompt the scorer rejects fails alone; the rest of its batch is scored one by one
    res = await asyncio.gather(*(policy.score_batched(p) for p in ["ab", "poison", "abcd"]), return_exceptions=True)
    assert res[0] == 0.02 and isinstance(res[1], ValueError) and res[2] == 0.04


# ---- issue 28: the context-length rule, and failures that are not the replica's ----
def test_context_rule_in_sglang_words_at_its_boundaries() -> None:
    from boute.serving.limits import context_error

    assert context_error(100, 28, 128) is None  # exactly the context: fits, as in SGLang
    assert context_error(100, 29, 128) == (
        "Requested token count exceeds the model's maximum context length of 128 tokens. You requested a total "
        "of 129 tokens: 100 tokens from the input messages and 29 tokens for the completion. Please reduce the "
        "number of tokens in the input messages or the completion to fit within the limit."
    )
    assert context_error(127, None, 128) is None  # no max_tokens: only the input is checked
    assert (
        context_error(128, None, 128)
        == "The input (128 tokens) is longer than the model's context length (128 tokens)."
    )
    assert "at least 10 tokens from the input" in (context_error(10, 10**8, 128, estimated=True) or "")


def test_gateway_refuses_what_cannot_fit_the_tiers_context() -> None:
    from router.admission import tier_context
    from router.openai_io import check_context

    assert tier_context(Plan.model_validate(TEST_PLAN)) == {"small": 131072, "large": 131072}
    chat = (
        b'{"model": "boute", "messages": [{"role": "system", "content": "%s"}, {"role": "user", "content": "q"}], %s}'
    )

    def refusal(raw: bytes) -> BadRequest | None:
        body, _, _, chars = parse_request(raw, CHAT)
        try:
            check_context(body, CHAT, chars, 131072)
        except BadRequest as exc:
            return exc
        return None

    huge = refusal(chat % (b"s", b'"max_tokens": 100000000'))
    assert huge is not None and (huge.status, huge.kind, huge.param, huge.code) == (
        400,
        "invalid_request_error",
        "max_tokens",
        "context_length_exceeded",
    )
    assert "maximum context length of 131072 tokens" in huge.message
    both = refusal(chat % (b"s", b'"max_tokens": 5, "max_completion_tokens": 200000'))
    assert both is not None and both.param == "max_completion_tokens"  # the newer field wins, as in OpenAI's API
    assert refusal(chat % (b"s", b'"max_tokens": 131000')) is None  # fits with any real tokenizer: passed on
    # every message counts: 1 MB of system text is at least 125,000 tokens, so 10,000 more cannot fit ...
    assert refusal(chat % (b"s" * 1_000_000, b'"max_tokens": 10000')) is not None
    # ... while the same text with a small answer is left to the replica, which counts exactly
    assert refusal(chat % (b"s" * 1_000_000, b'"max_tokens": 16')) is None


def test_failures_that_are_not_the_replicas_never_trip_it() -> None:
    """A read timeout (the request's own length) is counted as failed but not toward the circuit: any number
    of them leave the replica available, and a real failure after them still needs cb_failures in a row."""
    bal = _balancer()
    fast, _ = bal.pools["small"]
    for _ in range(10):
        bal.failure(fast, charge=False)
    assert fast.available(time.monotonic()) and fast.failed == 10 and fast.failures == 0
    bal.failure(fast)
    bal.failure(fast)
    assert fast.available(time.monotonic())
    bal.failure(fast)
    assert not fast.available(time.monotonic())


class _Health:
    """Stands in for the pool in health checks: per URL, what ``GET /health`` does next."""

    def __init__(self) -> None:
        self.answers: dict[str, object] = {}

    async def get_status(self, url: str, path: str, timeout: float) -> int:
        a = self.answers.get(url, 200)
        if isinstance(a, BaseException):
            raise a
        assert isinstance(a, int)
        return a


async def test_a_late_health_answer_takes_a_replica_out_only_when_it_repeats() -> None:
    """A replica busy with one heavy request can answer its health check late; out only after cb_failures
    late checks in a row (an answer in between resets them), while a refused check takes it out at once."""
    from router.upstream import ConnectError

    bal = _balancer()
    fast, slow = bal.pools["small"]
    health = _Health()
    health.answers = {fast.url: TimeoutError(), slow.url: ConnectError("refused", refused=True)}
    await bal.check_all(health)
    assert fast.healthy and not slow.healthy and bal.healthy("small") == 1
    await bal.check_all(health)
    assert fast.healthy
    health.answers[fast.url] = 200  # it answered: the count starts over
    await bal.check_all(health)
    health.answers[fast.url] = TimeoutError()
    for _ in range(2):
        await bal.check_all(health)
    assert fast.healthy
    await bal.check_all(health)  # the third late answer in a row
    assert not fast.healthy and bal.healthy("small") == 0
    health.answers = {}
    await bal.check_all(health)
    assert fast.healthy and slow.healthy


def test_thresholds_beyond_every_score_survive_a_round_trip(tmp_path: Path) -> None:
    """A tier that accepts everything has a -inf threshold: written and read back as -inf (was null, which
    made the written plan unreadable)."""
    from boute.serving.bundle import open_plan
    from boute.specs.plan import save_plan

    plan = Plan.model_validate(_cascade(fractions=[1.0, 0.0], thresholds=[float("-inf")], judge="llm"))
    for name in ("p.json", "p.yaml"):
        assert open_plan(save_plan(plan, tmp_path / name)).routing.thresholds == [float("-inf")]
    assert Plan.model_validate_json(plan.model_dump_json()).routing.thresholds == [float("-inf")]
