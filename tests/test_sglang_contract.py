"""Contract tests against SGLang's own code (issue 30): ``pytest -k sglang`` selects them all.

The judge is SGLang 0.5.23 itself (``backends/sglang/contract.py`` in a child process with the contract install of
``make sglang-contract`` on its path): its ``prepare_server_args`` parses every argv the launcher emits, and its
OpenAI protocol models validate the emulated backend's requests, responses, stream chunks and errors. A
verdict names the field: a pydantic error's location, or a key SGLang's model does not define. The emulated
bodies are also compared, key by key, with bodies the real SGLang server answered on this CPU
(``tests/sglang_recorded/``). Without the contract install the tests skip with the reason its build recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.deploy.desired import ReplicaKey
from backends.deploy.launch import LaunchOptions, replica_process
from backends.emulated.launch import free_port, replica_configs
from backends.emulated.profile import ReplicaConfig
from backends.sglang import BARE_FLAGS, SGLangOptions, argv_flags, place_plan, sglang_argv
from backends.sglang import build as sglang_build
from backends.sglang.cpu import cpu_options
from boute.specs.plan import Plan, ReplicaGroup, Routing
from tests.stack import serving_replicas

pytestmark = pytest.mark.timeout(240)  # one child process imports SGLang (~10 s idle, a minute on busy cores)

ROOT = Path(__file__).resolve().parent.parent
RECORDED = json.loads((Path(__file__).parent / "sglang_recorded" / "sglang-0.5.23-cpu.json").read_text())
#: keys the emulated backend adds on purpose: service_ms (its handler's own time, for the gateway bench)
EMULATOR_EXTRAS = {"service_ms"}


def _judge_env() -> dict[str, str]:
    status = sglang_build.read_status(sglang_build.contract_dir())
    if status is None:
        pytest.skip("SGLang's contract install is missing: run `make sglang-contract`")
    if not status.get("ok"):
        pytest.skip(f"SGLang's contract install failed: {status.get('reason')}")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(status["lib"]), str(ROOT)])}


def judge(
    argvs: list[list[str]] | None = None,
    payloads: list[dict[str, Any]] | None = None,
    usages: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """SGLang's verdicts on launcher argvs (after ``-m sglang.launch_server``) and protocol payloads, and the
    usages its UsageProcessor makes of meta_info counts (``backends/sglang/contract.py``)."""
    job = json.dumps({"argvs": argvs or [], "payloads": payloads or [], "usages": usages or []})
    proc = subprocess.run(
        [sys.executable, "-m", "backends.sglang.contract"],
        input=job,
        capture_output=True,
        text=True,
        env=_judge_env(),
        timeout=200,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _plan() -> Plan:
    return Plan(
        routing=Routing(tiers=["small", "large"], fractions=[0.6, 0.4], scorer="length", reference="builtin:gsm8k"),
        deployment=[
            ReplicaGroup(tier="small", model="llama-3.1-8b", gpu="rtx-4090", count=2),
            ReplicaGroup(tier="large", model="llama-3.1-70b", gpu="h100-sxm", count=1, tp=2, pp=2, dtype="fp8"),
        ],
    )


#: what each launcher flag means in SGLang's ServerArgs (the field the parser must fill)
FLAG_FIELDS = {
    "--model-path": "model_path",
    "--host": "host",
    "--port": "port",
    "--tp-size": "tp_size",
    "--pp-size": "pp_size",
    "--mem-fraction-static": "mem_fraction_static",
    "--chunked-prefill-size": "chunked_prefill_size",
    "--context-length": "context_length",
    "--served-model-name": "served_model_name",
    "--quantization": "quantization",
    "--device": "device",
    "--attention-backend": "attention_backend",
    "--max-total-tokens": "max_total_tokens",
    "--api-key": "api_key",
    "--enable-cache-report": "enable_cache_report",
}


def _launcher_argvs() -> list[list[str]]:
    """Every shape of command the launcher emits: options on and off, fp8, placed plan replicas, CPU extras."""
    argvs = [
        sglang_argv("/m/8b", port=30000),
        sglang_argv(
            "/m/70b",
            port=31000,
            tp=4,
            pp=2,
            dtype="fp8",
            served_model_name="large",
            options=SGLangOptions(mem_fraction_static=0.85, chunked_prefill_size=4096, host="0.0.0.0"),
        ),
        sglang_argv("/m/x", port=30001, options=SGLangOptions(chunked_prefill_size=None, context_length=4096)),
        sglang_argv("/m/smol", port=30002, served_model_name="small", options=cpu_options(sys.executable)),
    ]
    argvs += [list(s.argv) for s in place_plan(_plan(), {"rtx-4090": [0, 1], "h100-sxm": [0, 1, 2, 3]})]
    argvs += _deployer_argvs()
    return [a[3:] for a in argvs]  # after `python -m sglang.launch_server`


def _deployer_argvs() -> list[list[str]]:
    """What ``boute deploy up`` starts per replica (``replica_process``): on GPUs, and with ``--sglang-cpu`` (the
    CPU engine's flags, tp/pp collapsed to one process), each also with a replica token (``--api-key``)."""
    key = ReplicaKey(tier="large", model="llama-3.1-70b", gpu="h100-sxm", tp=4, pp=2, dtype="fp8")
    gpu = LaunchOptions(emulate=False, python=sys.executable, model_paths={"large": "/m/70b"})
    cpu = LaunchOptions(emulate=False, sglang_cpu=True, python=sys.executable, default_model_path="/m/smol")
    argvs = []
    for opts in (gpu, cpu, replace(cpu, max_total_tokens=4096, token="t0ken")):
        argvs.append(list(replica_process(key, 30100, "127.0.0.1", opts, gpu_ids=(0, 1)).argv))
    return argvs


def test_sglang_cpu_deployer_argv_is_the_cpu_engines() -> None:
    """The ``--sglang-cpu`` replica's argv carries the CPU engine's flags and one process (no tp/pp > 1); the
    parser test above then proves SGLang reads each of them back."""
    _, cpu, capped = (a[3:] for a in _deployer_argvs())
    flags = _flag_values(cpu)
    assert flags["--device"] == "cpu" and flags["--attention-backend"] == "torch_native"
    assert flags["--tp-size"] == "1" and flags.get("--pp-size", "1") == "1"
    assert flags["--served-model-name"] == "large" and flags["--model-path"] == "/m/smol"
    assert _flag_values(capped)["--max-total-tokens"] == "4096" and _flag_values(capped)["--api-key"] == "t0ken"


def _flag_values(argv: list[str]) -> dict[str, str | bool]:
    """The launcher's flags read back (``argv_flags``: bare ones are True); the parser test below proves that
    its idea of which flags are bare is SGLang's."""
    return argv_flags(argv)


def test_sglang_parser_reads_every_launcher_argv_back() -> None:
    """SGLang's prepare_server_args accepts each argv and fills each field with the value we meant; the flags
    BOute pairs with no value (BARE_FLAGS) are exactly those SGLang's parser takes none for."""
    argvs = _launcher_argvs()
    verdicts = judge(argvs=argvs)["argvs"]
    for argv, v in zip(argvs, verdicts, strict=True):
        assert v["ok"], f"SGLang refused {argv}: {v['error']}"
        assert set(v["bare"]) == {a for a in argv if a in BARE_FLAGS}, (argv, v["bare"])
        for flag, value in _flag_values(argv).items():
            field = FLAG_FIELDS.get(flag)
            assert field is not None, f"the launcher emits {flag}, which this test does not map to a ServerArgs field"
            got = v["args"][field]
            want: Any = type(got)(value) if isinstance(got, (int, float)) and value is not True else value
            assert got == want, f"{flag} {value}: SGLang's ServerArgs.{field} = {got!r}"


def test_sglang_every_launched_replica_reports_cache_hits() -> None:
    """Every real replica BOute launches (plan placement, ``boute deploy up`` on GPUs and ``--sglang-cpu``, the
    CPU helper's options) has SGLang's ``enable_cache_report`` set, so its usage carries prefix-cache hits;
    turned off in the options, the parser's default (off) comes back."""
    argvs = _launcher_argvs()
    off = sglang_argv("/m", port=30003, options=SGLangOptions(enable_cache_report=False))[3:]
    *verdicts, v_off = judge(argvs=[*argvs, off])["argvs"]
    assert all(v["ok"] and v["args"]["enable_cache_report"] is True for v in verdicts), argvs
    assert v_off["ok"] and v_off["args"]["enable_cache_report"] is False and "--enable-cache-report" not in off


def test_sglang_parser_catches_a_drifted_flag() -> None:
    """The deliberate drift: a flag SGLang does not have (a renamed --tp-size) fails, naming the flag."""
    good = _launcher_argvs()[0]
    drifted = [("--tp" + "-sise") if a == "--tp-size" else a for a in good]
    v = judge(argvs=[drifted])["argvs"][0]
    assert not v["ok"] and "--tp-sise" in v["error"]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cfg = ReplicaConfig(model="llama-3.1-8b", gpu="h100-sxm", port=free_port(), speedup=200)
    with serving_replicas([cfg], tmp_path_factory.mktemp("emu")) as url:
        yield url


CHAT = {"model": "small", "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 8}
COMPLETION = {"model": "small", "prompt": "The capital of France is", "max_tokens": 6}


def _sse(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln[6:]) for ln in lines[:-1]]


@pytest.fixture(scope="module")
def bodies(emulated: str) -> dict[str, Any]:
    """The emulated backend's answers to the requests the real server was recorded answering."""
    chat, compl = emulated + "/v1/chat/completions", emulated + "/v1/completions"
    too_long = {**CHAT, "max_tokens": 10**6}
    return {
        "chat": httpx.post(chat, json=CHAT, timeout=60).json(),
        "completion": httpx.post(compl, json=COMPLETION, timeout=60).json(),
        "chat_stream": _sse(chat, {**CHAT, "stream": True}),
        "chat_stream_usage": _sse(chat, {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
        "completion_stream": _sse(compl, {**COMPLETION, "stream": True}),
        "error_context": httpx.post(chat, json=too_long, timeout=60).json(),
        "error_validation": httpx.post(compl, json={**COMPLETION, "max_tokens": -1}, timeout=60).json(),
        "models": httpx.get(emulated + "/v1/models").json(),
    }


#: which SGLang protocol model judges each body
JUDGED_AS = {
    "chat": "ChatCompletionResponse",
    "completion": "CompletionResponse",
    "chat_stream": "ChatCompletionStreamResponse",
    "chat_stream_usage": "ChatCompletionStreamResponse",
    "completion_stream": "CompletionStreamResponse",
    "error_context": "ErrorResponse",
    "error_validation": "ErrorResponse",
    "models": "ModelList",
}


def _payloads(bodies: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for name, body in bodies.items():
        for i, b in enumerate(body if isinstance(body, list) else [body]):
            out.append((f"{name}[{i}]", {"model": JUDGED_AS[name], "data": b}))
    return out


def test_sglang_protocol_accepts_the_emulated_requests() -> None:
    """What BOute's clients send (chat, completion, streamed with usage) is a valid SGLang request, field by field."""
    requests = [
        {"model": "ChatCompletionRequest", "data": CHAT},
        {"model": "ChatCompletionRequest", "data": {**CHAT, "stream": True, "stream_options": {"include_usage": True}}},
        {"model": "CompletionRequest", "data": COMPLETION},
        {"model": "CompletionRequest", "data": {**COMPLETION, "stream": True, "temperature": 0.0}},
    ]
    for req, v in zip(requests, judge(payloads=requests)["payloads"], strict=True):
        assert v == {"errors": [], "unknown": []}, (req, v)


def test_sglang_protocol_accepts_the_emulated_responses(bodies: dict[str, Any]) -> None:
    """Every emulated response, stream chunk and error validates as SGLang's own model, with no field it lacks."""
    payloads = _payloads(bodies)
    verdicts = judge(payloads=[p for _, p in payloads])["payloads"]
    for (where, _), v in zip(payloads, verdicts, strict=True):
        assert not v["errors"], f"{where}: {v['errors']}"
        unknown = {u for u in v["unknown"] if u.rsplit(".", 1)[-1] not in EMULATOR_EXTRAS}
        assert not unknown, f"{where}: fields SGLang's {JUDGED_AS[where.split('[')[0]]} does not define: {unknown}"


def test_sglang_protocol_names_a_drifted_field(bodies: dict[str, Any]) -> None:
    """The deliberate drift, both kinds: a renamed usage field and a wrongly typed finish reason, each named."""
    chat = json.loads(json.dumps(bodies["chat"]))
    chat["usage"]["completion_token"] = chat["usage"].pop("completion_tokens")
    err = {**bodies["error_context"], "code": None}  # the emulator's old OpenAI-style code
    v_chat, v_err = judge(
        payloads=[{"model": "ChatCompletionResponse", "data": chat}, {"model": "ErrorResponse", "data": err}]
    )["payloads"]
    assert "usage.completion_token" in v_chat["unknown"]
    assert any(e.startswith("code:") for e in v_err["errors"]), v_err


def _shape(value: Any) -> Any:
    """A body's structure: keys (recursively) and, for leaves, whether they are null."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value[:1]]
    return None if value is None else type(value).__name__


def _keys(value: Any, path: str = "") -> set[str]:
    if isinstance(value, dict):
        return set().union(*({f"{path}.{k}"} | _keys(v, f"{path}.{k}") for k, v in value.items()))
    if isinstance(value, list) and value:
        return _keys(value[0], f"{path}[]")
    return set()


@pytest.mark.parametrize("name", ["chat", "completion", "error_context", "error_validation", "models"])
def test_sglang_recorded_bodies_match_the_emulated_ones_key_for_key(bodies: dict[str, Any], name: str) -> None:
    """The emulated body has exactly the keys real SGLang's had (its documented extras aside)."""
    real, emu = RECORDED[name], bodies[name]
    extras = {k for k in _keys(emu) if k.rsplit(".", 1)[-1] in EMULATOR_EXTRAS}
    assert _keys(emu) - extras == _keys(real), (
        f"emulated-only {_keys(emu) - extras - _keys(real)}, real-only {_keys(real) - _keys(emu)}"
    )


@pytest.mark.parametrize("name", ["chat_stream", "chat_stream_usage", "completion_stream"])
def test_sglang_recorded_streams_match_the_emulated_ones(bodies: dict[str, Any], name: str) -> None:
    """First chunk, a content chunk, the finish chunk and (include_usage) the usage chunk: the same keys as SGLang's."""
    real, emu = RECORDED[name], bodies[name]

    def roles(chunks: list[dict[str, Any]]) -> dict[str, set[str]]:
        fin = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["finish_reason"])
        out = {"first": _keys(chunks[0]), "finish": _keys(chunks[fin]), "middle": _keys(chunks[min(1, fin)])}
        if fin + 1 < len(chunks):
            out["usage"] = _keys(chunks[fin + 1])
        return out

    assert roles(emu) == roles(real)
    if name == "chat_stream_usage":
        assert emu[-1]["choices"] == [] and emu[-1]["usage"]["completion_tokens"] == CHAT["max_tokens"]


def test_sglang_error_bodies_and_context_rule_match_the_recorded_server(bodies: dict[str, Any]) -> None:
    """Context errors: SGLang's type, code and message (counts aside); validation errors: its type and code."""
    real, emu = RECORDED["error_context"], bodies["error_context"]
    assert (emu["object"], emu["type"], emu["code"], emu["param"]) == ("error", "BadRequestError", 400, None)
    assert (real["object"], real["type"], real["code"]) == (emu["object"], emu["type"], emu["code"])
    head = "Requested token count exceeds the model's maximum context length of"
    assert real["message"].startswith(head) and emu["message"].startswith(head)
    assert (bodies["error_validation"]["type"], bodies["error_validation"]["code"]) == ("Bad Request", 400)
    assert (RECORDED["error_validation"]["type"], RECORDED["error_validation"]["code"]) == ("Bad Request", 400)


def test_sglang_native_routes_match_the_recorded_server(emulated: str) -> None:
    """/health and /health_generate: 200, empty; /metrics: 404 (no --enable-metrics); /get_model_info's keys
    a subset of SGLang's; /generate's finish reason and meta counts as SGLang's."""
    for route in ("/health", "/health_generate"):
        r = httpx.get(emulated + route)
        assert (r.status_code, r.content) == (200, b"")
    assert httpx.get(emulated + "/metrics").status_code == 404
    info = httpx.get(emulated + "/get_model_info").json()
    assert set(info) <= set(RECORDED["model_info_keys"]), set(info) - set(RECORDED["model_info_keys"])
    gen = httpx.post(emulated + "/generate", json={"text": "q", "sampling_params": {"max_new_tokens": 4}}).json()
    real = RECORDED["generate"]
    assert gen["meta_info"]["finish_reason"] == real["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    # output_ids: the emulator has no tokenizer (its tokens are 4-character pieces), so no ids to give
    assert set(gen) == set(real) - {"output_ids"}
    missing = set(real["meta_info"]) - set(gen["meta_info"])
    assert missing <= {
        "num_retractions",
        "reasoning_tokens",
        "weight_versions",
        "cached_tokens_details",
        "dp_rank",
        "response_sent_to_client_ts",
    }, missing
    err = httpx.post(emulated + "/generate", json={"text": "q", "sampling_params": {"max_new_tokens": 10**7}})
    assert err.status_code == 400 and set(err.json()) == {"error"} and set(err.json()["error"]) == {"message"}


@pytest.fixture(scope="module")
def reporting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The plan's replicas as ``boute serve --emulate`` starts them (``replica_configs``): with SGLang's
    ``--enable-cache-report``, which BOute needs to read prefix-cache hits."""
    configs = replica_configs(_plan(), speedup=200)
    assert all(c.enable_cache_report for c in configs)
    with serving_replicas(configs, tmp_path_factory.mktemp("emu-report")) as url:
        yield url


def _meta(usage: dict[str, Any]) -> dict[str, int]:
    """The meta_info counts SGLang's usage is made of, read back from an emulated usage."""
    details = usage["prompt_tokens_details"] or {}
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "reasoning_tokens": usage["reasoning_tokens"],
        "cached_tokens": details.get("cached_tokens", 0),
    }


def test_sglang_cache_report_usage_is_sglangs(reporting: str, bodies: dict[str, Any]) -> None:
    """Prefix-cache hits reported as SGLang reports them: with --enable-cache-report (what serve --emulate turns
    on) usage.prompt_tokens_details is SGLang's PromptTokensDetails with the hit, whole and in the streamed usage
    chunk; without it null. Each usage validates as SGLang's UsageInfo and equals what SGLang's own
    UsageProcessor makes of the same counts, with the flag as the replica had it."""
    chat, compl = reporting + "/v1/chat/completions", reporting + "/v1/completions"
    first = httpx.post(chat, json=CHAT, timeout=60).json()
    again = httpx.post(chat, json=CHAT, timeout=60).json()
    streamed = _sse(chat, {**CHAT, "stream": True, "stream_options": {"include_usage": True}})[-1]
    completions = [httpx.post(compl, json=COMPLETION, timeout=60).json() for _ in range(2)]
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    hit = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert hit == again["usage"]["prompt_tokens"] - 1  # the whole prompt was cached: all but its last token
    assert streamed["usage"]["prompt_tokens_details"] == {"cached_tokens": hit}
    assert completions[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    judged = [("ChatCompletionResponse", again), ("ChatCompletionStreamResponse", streamed)]
    judged += [("CompletionResponse", completions[1]), ("UsageInfo", again["usage"])]
    verdicts = judge(payloads=[{"model": m, "data": d} for m, d in judged])["payloads"]
    for (model, _), v in zip(judged, verdicts, strict=True):
        assert not v["errors"], f"{model}: {v['errors']}"
        assert not {u for u in v["unknown"] if u.rsplit(".", 1)[-1] not in EMULATOR_EXTRAS}, (model, v)
    cases = [(again["usage"], True, False), (streamed["usage"], True, True), (completions[0]["usage"], True, False)]
    cases += [(bodies["chat"]["usage"], False, False), (bodies["chat_stream_usage"][-1]["usage"], False, True)]
    jobs = [{"meta_info": _meta(u), "enable_cache_report": r, "stream": st} for u, r, st in cases]
    for (usage, _, _), sglangs in zip(cases, judge(usages=jobs)["usages"], strict=True):
        assert usage == sglangs


def test_sglang_generate_reports_cached_tokens_as_the_recorded_server(reporting: str) -> None:
    """/generate's meta_info.cached_tokens is the hit whatever the flag (SGLang's tokenizer manager always sets
    it), with cached_tokens_details in the recorded server's shape (its radix cache: all on the device)."""
    body = {"text": "The largest city of Japan is", "sampling_params": {"max_new_tokens": 4}}
    metas = [httpx.post(reporting + "/generate", json=body, timeout=60).json()["meta_info"] for _ in range(2)]
    assert (metas[0]["cached_tokens"], metas[0]["cached_tokens_details"]) == (0, None)
    real = RECORDED["generate"]["meta_info"]
    assert real["cached_tokens"] == real["prompt_tokens"] - 1  # the recorded server answered a repeated prompt
    assert metas[1]["cached_tokens"] == metas[1]["prompt_tokens"] - 1
    assert metas[1]["cached_tokens_details"] == {"device": metas[1]["cached_tokens"], "host": 0}
    assert set(metas[1]["cached_tokens_details"]) == set(real["cached_tokens_details"])


def test_sglang_parser_reads_the_emulated_cache_report_flag() -> None:
    """The emulated replica's --enable-cache-report is SGLang's flag (what its parser fills), and the emulated
    replicas of ``boute deploy up --emulate`` are started with it."""
    key = ReplicaKey(tier="small", model="llama-3.1-8b", gpu="rtx-4090", tp=1, pp=1, dtype="bf16")
    opts = LaunchOptions(emulate=True, python=sys.executable)
    assert "--enable-cache-report" in replica_process(key, 30100, "127.0.0.1", opts).argv
    v = judge(argvs=[["--model-path", "/m", "--enable-cache-report"], ["--model-path", "/m"]])["argvs"]
    assert v[0]["ok"] and v[0]["args"]["enable_cache_report"] is True
    assert v[1]["ok"] and v[1]["args"]["enable_cache_report"] is False  # SGLang's default: no report
