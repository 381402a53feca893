"""SGLang command builder: flags and GPU placement. SGLang's own parser reads every argv back in
tests/test_sglang_contract.py (the copied flag list that stood in for it is gone)."""

from __future__ import annotations

import pytest

from backends.sglang import SGLangOptions, argv_flags, place_plan, replica_spec, sglang_argv
from boute.errors import BouteError
from boute.specs.plan import Plan, ReplicaGroup, Routing


def _plan() -> Plan:
    return Plan(
        routing=Routing(tiers=["small", "large"], fractions=[0.6, 0.4], scorer="length", reference="builtin:gsm8k"),
        deployment=[
            ReplicaGroup(tier="small", model="llama-3.1-8b", gpu="rtx-4090", count=2),
            ReplicaGroup(tier="large", model="llama-3.1-70b", gpu="h100-sxm", count=1, tp=2, pp=2, dtype="fp8"),
        ],
    )


def _flags(argv: list[str]) -> dict[str, str | bool]:
    """argv after ``-m sglang.launch_server`` -> {flag: value}, True for a bare flag (``argv_flags``, whose bare
    flags the contract tests check against SGLang's own parser)."""
    return argv_flags(argv[3:])


def test_argv_carries_parallelism_memory_and_port() -> None:
    argv = sglang_argv(
        "/models/llama-70b",
        port=31000,
        tp=4,
        pp=2,
        dtype="fp8",
        served_model_name="large",
        options=SGLangOptions(mem_fraction_static=0.85, chunked_prefill_size=4096, host="0.0.0.0"),
    )
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    f = _flags(argv)
    assert f["--model-path"] == "/models/llama-70b" and f["--port"] == "31000" and f["--host"] == "0.0.0.0"
    assert f["--tp-size"] == "4" and f["--pp-size"] == "2"
    assert f["--mem-fraction-static"] == "0.85" and f["--chunked-prefill-size"] == "4096"
    assert f["--quantization"] == "fp8" and f["--served-model-name"] == "large"
    assert f["--enable-cache-report"] is True  # BOute reads prefix-cache hits from the usage


def test_cache_report_can_be_turned_off_and_argv_flags_refuses_a_misread() -> None:
    argv = sglang_argv("/m", port=30000, options=SGLangOptions(enable_cache_report=False))
    assert "--enable-cache-report" not in argv and "--enable-cache-report" not in _flags(argv)
    # an unknown bare flag would swallow the next flag as its value: refused instead of misread
    with pytest.raises(BouteError, match="--enable-metrics has no value"):
        argv_flags(["--enable-metrics", "--port", "1"])
    with pytest.raises(BouteError, match="expected a flag"):
        argv_flags(["--port", "1", "2"])


def test_place_plan_assigns_disjoint_gpus_and_ports() -> None:
    specs = place_plan(_plan(), {"rtx-4090": [0, 1, 2], "h100-sxm": [4, 5, 6, 7]}, model_paths={"small": "/m/8b"})
    assert [s.name for s in specs] == ["small-rtx-4090-0", "small-rtx-4090-1", "large-h100-sxm-0"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0", "1", "4,5,6,7"]
    ports = [_flags(list(s.argv))["--port"] for s in specs]
    assert ports == ["30000", "30001", "30002"]
    assert specs[0].health_url == "http://127.0.0.1:30000/health"
    assert _flags(list(specs[0].argv))["--model-path"] == "/m/8b"
    assert _flags(list(specs[2].argv))["--model-path"] == "meta-llama/Llama-3.1-70B-Instruct"  # catalog hf_id
    assert "--quantization" not in specs[0].argv


def test_place_plan_names_group_without_enough_gpus() -> None:
    with pytest.raises(BouteError, match=r"deployment\[1\] \(large on h100-sxm\): needs 4 GPUs, 3 of that type"):
        place_plan(_plan(), {"rtx-4090": [0, 1], "h100-sxm": [0, 1, 2]})


def test_bad_inputs_are_user_errors() -> None:
    g = ReplicaGroup(tier="t", model="llama-3.1-8b", gpu="h100-sxm", tp=2)
    with pytest.raises(BouteError, match="needs 2 GPU ids"):
        replica_spec(g, 0, model_path="m", port=30000, gpu_ids=[0])
    with pytest.raises(BouteError, match="mem_fraction_static"):
        SGLangOptions(mem_fraction_static=1.5)
    with pytest.raises(BouteError, match="port"):
        sglang_argv("m", port=70000)
