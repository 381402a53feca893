"""Serving engines as the performance model sees them: memory rules, batch limits, prefill scheduling.

Published measurements come from several engines, and how an engine schedules prefill decides what a
benchmark measures as much as the hardware does. Each :class:`EngineSpec` carries only settings that are
documented defaults (or stated in the benchmark's description); the engine's fixed per-step overhead is
not a setting but a fitted term (``Structure.engine_overhead_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass

from boute.errors import BouteError


@dataclass(frozen=True)
class EngineSpec:
    """Scheduling and memory behaviour of one serving engine (documented defaults)."""

    name: str
    #: prefill chunks ride in the same step as decode tokens (in-flight batching / chunked prefill); if
    #: False, a prefill is a separate step that stalls decoding (SGLang's default, BOute's simulator)
    mixed_prefill: bool
    #: cap on sequences in one step
    max_batch: int
    #: cap on new tokens in one step (chunk size)
    max_step_tokens: int
    #: KV pool = ``mem_fraction`` x device memory - runtime reserve - weights (SGLang, vLLM) ...
    mem_fraction: float | None = None
    #: ... or ``kv_free_fraction`` x (device memory - weights - reserve) (TensorRT-LLM)
    kv_free_fraction: float | None = None
    #: whether admission reserves a request's whole output (TensorRT-LLM "guaranteed no evict", BOute's
    #: simulator) or only its current length (vLLM pages on demand and preempts)
    reserve_output: bool = True
    #: which fitted overhead applies
    overhead_key: str = "sglang"
    #: decode attention reads each KV head once for its whole GQA group; False: once per query head
    #: (TensorRT-LLM before v0.10 ran GQA models through MHA-style kernels unless its experimental XQA
    #: kernels were switched on: "not enabled by default", v0.9 performance.md)
    gqa_kv_sharing: bool = True


ENGINES: dict[str, EngineSpec] = {
    # BOute deploys SGLang: --mem-fraction-static ~0.88, chunked prefill 8192, no mixed batches by default
    "sglang": EngineSpec("sglang", False, 2048, 8192, mem_fraction=0.88, overhead_key="sglang"),
    # TensorRT-LLM static-batch benchmark (gptSessionBenchmark, v0.5-v0.9): engines reserve nearly all memory
    "trtllm-static": EngineSpec(
        "trtllm-static", False, 4096, 1 << 30, mem_fraction=0.98, overhead_key="trtllm", gqa_kv_sharing=False
    ),
    # the same benchmark in v0.9, whose docs say GQA (XQA) kernels were enabled where they helped
    "trtllm-static-xqa": EngineSpec(
        "trtllm-static-xqa", False, 4096, 1 << 30, mem_fraction=0.98, overhead_key="trtllm"
    ),
    # trtllm-bench throughput (v0.12+): in-flight batching with chunked context, KV 0.95 of free memory,
    # the example output in perf-overview prints max runtime batch 4096 and 8192 tokens
    "trtllm": EngineSpec("trtllm", True, 4096, 8192, kv_free_fraction=0.95, overhead_key="trtllm"),
    # gptManagerBenchmark, the in-flight batching benchmark before trtllm-bench (perf-overview v0.10/v0.11
    # state the engines' limits): v0.10 max_utilization scheduler (pauses requests instead of reserving
    # their output), KV 0.9 of free memory, max batch 2048, 2048 tokens per step ...
    "trtllm-gptmanager-maxutil": EngineSpec(
        "trtllm-gptmanager-maxutil",
        True,
        2048,
        2048,
        kv_free_fraction=0.9,
        reserve_output=False,
        overhead_key="trtllm",
    ),
    # ... v0.11 guaranteed_no_evict, KV 0.99 of free memory, max batch 2048, 3072 tokens per step
    "trtllm-gptmanager-noevict": EngineSpec(
        "trtllm-gptmanager-noevict", True, 2048, 3072, kv_free_fraction=0.99, overhead_key="trtllm"
    ),
    # Triton tensorrtllm_backend online serving (v0.14 table): default free-memory fraction 0.9; at
    # QPS INF the table's own figures give ~240-250 requests in flight (req/s x latency, Little's law),
    # i.e. a batch cap of 256
    "trtllm-triton": EngineSpec("trtllm-triton", True, 256, 8192, kv_free_fraction=0.9, overhead_key="trtllm"),
    # NIM LLM containers run TensorRT-LLM profiles
    "nim": EngineSpec("nim", True, 2048, 8192, kv_free_fraction=0.9, overhead_key="trtllm"),
    # vLLM V1: gpu_memory_utilization 0.9, max_num_seqs 256, chunked prefill on, pages on demand
    "vllm": EngineSpec("vllm", True, 256, 8192, mem_fraction=0.9, reserve_output=False, overhead_key="vllm"),
}


def engine_spec(name: str) -> EngineSpec:
    try:
        return ENGINES[name]
    except KeyError:
        raise BouteError(f"unknown engine '{name}' (known: {', '.join(sorted(ENGINES))})") from None
