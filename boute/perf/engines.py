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
class AllReduceRule:
    """Which all-reduce kernel an engine runs for a message of a given size over NVLink.

    Engines run small all-reduces as their own kernels over peer memory and hand large ones to NCCL: a
    one-shot kernel (every GPU reads all its peers' buffers: ``(tp - 1) x bytes`` per GPU, one
    synchronisation), then, where enabled, a two-shot kernel (reduce-scatter + all-gather: ring traffic,
    one synchronisation), and beyond that NCCL's ring (ring traffic and ``2 (tp - 1)`` hops, each with
    its latency). Limits are per message in bytes, for TP 2, TP 3-4 and TP 5-8. Without NVLink the custom
    kernels are off and every all-reduce is NCCL's.
    """

    #: largest message of the one-shot kernel, for TP 2 / TP <= 4 / larger
    oneshot_max_bytes: tuple[float, float, float]
    #: largest message of any custom kernel (two-shot between the one-shot limit and this); beyond: NCCL
    custom_max_bytes: tuple[float, float, float]

    def limits(self, tp: int, nvlink: bool) -> tuple[float, float]:
        """(one-shot limit, custom-kernel limit) in bytes for ``tp`` GPUs."""
        if tp <= 1 or not nvlink:
            return 0.0, 0.0
        i = 0 if tp <= 2 else 1 if tp <= 4 else 2
        return self.oneshot_max_bytes[i], self.custom_max_bytes[i]


#: TensorRT-LLM's AUTO strategy in its v0.17-era allreduce plugin (``selectImplementation``): one-shot up to
#: 16 MB at TP 2, below 1 MB at TP <= 4 and below 500 kB beyond; the two-shot kernel "disabled as a
#: temporary measure" for a performance bug, so every larger message goes to NCCL. Which releases before
#: that ran it is not known; the rows from v0.10 on take it because the data prefer it (in sample p90 23.0%
#: against 24.1% with the older rule below, docs/perf-model.md)
TRTLLM_ALLREDUCE = AllReduceRule((16e6, 1e6, 5e5), (16e6, 1e6, 5e5))
#: an older plugin source: two-shot from the one-shot limit up to its 8 MB workspace (16 MB at TP 2); taken
#: for the v0.5-v0.9 static benchmarks
TRTLLM_ALLREDUCE_TWOSHOT = AllReduceRule((16e6, 1e6, 5e5), (16e6, 8e6, 8e6))
#: SGLang and vLLM's custom all-reduce (``cross_device_reduce_1stage`` / ``_2stage``): one stage at TP 2 and
#: below 512 KiB at TP <= 4 (256 KiB at TP 8), two stages up to its 8 MiB buffer, NCCL beyond
SGLANG_ALLREDUCE = AllReduceRule((8 * 2**20, 512 * 2**10, 256 * 2**10), (8 * 2**20, 8 * 2**20, 8 * 2**20))


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
    #: the all-reduce kernels it runs by message size
    allreduce: AllReduceRule = SGLANG_ALLREDUCE


ENGINES: dict[str, EngineSpec] = {
    # BOute deploys SGLang: --mem-fraction-static ~0.88, chunked prefill 8192, no mixed batches by default
    "sglang": EngineSpec("sglang", False, 2048, 8192, mem_fraction=0.88, overhead_key="sglang"),
    # TensorRT-LLM static-batch benchmark (gptSessionBenchmark, v0.5-v0.9): engines reserve nearly all memory
    "trtllm-static": EngineSpec(
        "trtllm-static",
        False,
        4096,
        1 << 30,
        mem_fraction=0.98,
        overhead_key="trtllm",
        gqa_kv_sharing=False,
        allreduce=TRTLLM_ALLREDUCE_TWOSHOT,
    ),
    # the same benchmark in v0.9, whose docs say GQA (XQA) kernels were enabled where they helped
    "trtllm-static-xqa": EngineSpec(
        "trtllm-static-xqa",
        False,
        4096,
        1 << 30,
        mem_fraction=0.98,
        overhead_key="trtllm",
        allreduce=TRTLLM_ALLREDUCE_TWOSHOT,
    ),
    # trtllm-bench throughput (v0.12+): in-flight batching with chunked context, KV 0.95 of free memory,
    # the example output in perf-overview prints max runtime batch 4096 and 8192 tokens
    "trtllm": EngineSpec(
        "trtllm", True, 4096, 8192, kv_free_fraction=0.95, overhead_key="trtllm", allreduce=TRTLLM_ALLREDUCE
    ),
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
        allreduce=TRTLLM_ALLREDUCE,
    ),
    # ... v0.11 guaranteed_no_evict, KV 0.99 of free memory, max batch 2048, 3072 tokens per step
    "trtllm-gptmanager-noevict": EngineSpec(
        "trtllm-gptmanager-noevict",
        True,
        2048,
        3072,
        kv_free_fraction=0.99,
        overhead_key="trtllm",
        allreduce=TRTLLM_ALLREDUCE,
    ),
    # Triton tensorrtllm_backend online serving (v0.14 table): default free-memory fraction 0.9; at
    # QPS INF the table's own figures give ~240-250 requests in flight (req/s x latency, Little's law),
    # i.e. a batch cap of 256
    "trtllm-triton": EngineSpec(
        "trtllm-triton", True, 256, 8192, kv_free_fraction=0.9, overhead_key="trtllm", allreduce=TRTLLM_ALLREDUCE
    ),
    # NIM LLM containers run TensorRT-LLM profiles. Their TP8 sweeps (DLI genai-perf data) show no step-time
    # jump where a decode batch's all-reduce passes the one-shot limit (50 users at TP8: 0.8 MB): the two-shot
    # kernel carries those messages, as in the older plugin
    "nim": EngineSpec(
        "nim", True, 2048, 8192, kv_free_fraction=0.9, overhead_key="trtllm", allreduce=TRTLLM_ALLREDUCE_TWOSHOT
    ),
    # vLLM V1: gpu_memory_utilization 0.9, max_num_seqs 256, chunked prefill on, pages on demand
    "vllm": EngineSpec("vllm", True, 256, 8192, mem_fraction=0.9, reserve_output=False, overhead_key="vllm"),
}


def engine_spec(name: str) -> EngineSpec:
    try:
        return ENGINES[name]
    except KeyError:
        raise BouteError(f"unknown engine '{name}' (known: {', '.join(sorted(ENGINES))})") from None
