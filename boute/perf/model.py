"""Analytical performance model of one serving replica (model x GPU type x TP x PP x dtype).

Memory decides whether a replica fits and how many KV tokens it holds; :mod:`boute.perf.physics` decides
how long each step takes. Datasheet peaks are scaled by per-GPU efficiency factors (``GPUSpec.efficiency``,
packaged from the fit on published measurements, overridable by calibration files) and by GPU-independent
structure terms (:class:`~boute.perf.structure.Structure`). Approximate by design: docs/perf-model.md
reports its held-out error on published measurements.

Pipeline parallelism splits the layers (and the memory) over ``pp`` GPUs; one token's pass traverses
the stages in turn (latency), while in-flight micro-batches keep all stages busy (throughput, see
``pipelined``). Tensor parallelism divides compute, weights and KV heads over ``tp`` GPUs and adds two
all-reduces per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from boute.catalog.schema import Efficiency, GPUSpec, ModelSpec
from boute.perf.engines import SGLANG_ALLREDUCE, EngineSpec
from boute.perf.physics import (
    DTYPE_BYTES,
    KV_DTYPE_BYTES,
    Rates,
    Shape,
    default_kv_dtype,
    step_time,
)
from boute.perf.structure import Structure, link_family, packaged_structure

Dtype = Literal["bf16", "fp8", "fp4"]

#: share of GPU memory SGLang's static pool may use (``--mem-fraction-static`` is ~0.88 by default)
DEFAULT_MEM_FRACTION = 0.88
#: datasheet "80 GB" of device memory is 80 GiB (an A100 80GB shows 81,920 MiB); weights/KV are in 1e9-byte GB
GIB = 2.0**30
#: activations, CUDA graphs, allocator slack kept outside the pool, GB per GPU
RUNTIME_RESERVE_GB = 1.5
#: below this many KV tokens a replica cannot serve realistic requests: treated as not fitting
MIN_KV_TOKENS = 4096


#: bytes per embedding / LM-head weight: quantised checkpoints (FP8, NVFP4) keep both in 16 bits
EMBEDDING_BYTES = 2.0


def embedding_params(model: ModelSpec) -> tuple[float, float]:
    """(stored, read per step) embedding parameters: the input table and the LM head (one if tied).

    A step reads all of the LM head (every sequence's logits) but only the input rows of its tokens.
    """
    table = float(model.vocab * model.hidden)
    return (table if model.tied_embeddings else 2.0 * table), table


def weight_bytes(model: ModelSpec, dtype: str) -> tuple[float, float]:
    """(stored, read per step) weight bytes of the whole model in ``dtype``.

    Quantised checkpoints quantise the transformer body only: the embeddings and LM head stay 16-bit
    (ModelOpt FP8/NVFP4, FP8 checkpoints of vLLM/SGLang), which matters for KV room on tight fits.
    """
    stored_emb, read_emb = embedding_params(model)
    body = model.params_b * 1e9 - stored_emb
    w = DTYPE_BYTES[dtype]
    return body * w + stored_emb * EMBEDDING_BYTES, body * w + read_emb * EMBEDDING_BYTES


def model_shape(model: ModelSpec, tp: int, pp: int, dtype: str, kv_dtype: str, gqa_kv_sharing: bool = True) -> Shape:
    """What the replica computes and reads per token (KV heads replicate when tp > kv_heads).

    ``gqa_kv_sharing=False`` (older MHA-style kernels) reads the KV cache once per query head.
    """
    wbytes = DTYPE_BYTES[dtype]
    _, total = weight_bytes(model, dtype)  # bytes a step reads (the LM head, not the input table)
    if model.is_moe:
        active = model.compute_params_b * 1e9 * wbytes
        expert = (model.params_b * 1e9 * wbytes - active) / (model.num_experts - model.experts_per_token)
    else:
        expert = 0.0
    kv_heads_per_gpu = math.ceil(model.kv_heads / tp)
    kv_per_token = 2.0 * model.layers * kv_heads_per_gpu * tp * model.head_dim * KV_DTYPE_BYTES[kv_dtype]
    read_factor = 1.0 if gqa_kv_sharing else model.heads / (kv_heads_per_gpu * tp)

    def f(x: float) -> np.ndarray:
        return np.asarray(x, dtype=float)

    return Shape(
        compute_params=f(model.compute_params_b * 1e9),
        expert_compute_params=f(expert / wbytes * model.experts_per_token),
        weight_bytes=f(total),
        expert_bytes=f(expert),
        num_experts=f(model.num_experts),
        experts_per_token=f(model.experts_per_token),
        attn_coef=f(model.layers * model.heads * model.head_dim),
        act_bytes_per_token=f(model.hidden * 2.0),
        kv_bytes_per_token=f(kv_per_token * read_factor),
        layers=f(model.layers),
        tp=f(tp),
        pp=f(pp),
    )


def peak_tflops(gpu: GPUSpec, dtype: str) -> float | None:
    """Dense peak of GEMMs in ``dtype`` (None: unsupported)."""
    return {"bf16": gpu.tflops_bf16, "fp8": gpu.tflops_fp8, "fp4": gpu.tflops_fp4}[dtype]


def allreduce_limits(engine: EngineSpec | None, gpu: GPUSpec, tp: int) -> dict[str, float]:
    """The one-shot and custom-kernel message limits of ``engine`` (default: SGLang's) on ``gpu`` at ``tp``."""
    rule = engine.allreduce if engine is not None else SGLANG_ALLREDUCE
    oneshot, custom = rule.limits(tp, link_family(gpu.link) == "nvlink")
    return {"oneshot_max_bytes": oneshot, "custom_max_bytes": custom}


def make_rates(
    *,
    gemm_peak_tflops: ArrayLike,
    bf16_peak_tflops: ArrayLike,
    bandwidth_gbs: ArrayLike,
    link_gbs: ArrayLike,
    tp: ArrayLike,
    compute: ArrayLike,
    compute_bf16: ArrayLike,
    bandwidth: ArrayLike,
    link: ArrayLike,
    overhead_ms: ArrayLike,
    allreduce_latency_s: ArrayLike,
    structure: Structure,
    seq_overhead_us: ArrayLike = 0.0,
    gemm_half_tokens: ArrayLike | None = None,
    ring_hop_latency_s: ArrayLike = 0.0,
    oneshot_max_bytes: ArrayLike = 0.0,
    custom_max_bytes: ArrayLike = 0.0,
    speed: ArrayLike = 1.0,
) -> Rates:
    """Effective rates: peak x efficiency x TP degree (the one place that rule lives).

    ``speed`` is the engine's kernel speed against the reference the efficiencies describe (a fitted
    TensorRT-LLM release speed, :data:`boute.perf.rows.SPEEDS`): it scales the tensor and memory peaks.
    """
    a = np.asarray
    scale = a(tp, dtype=float) * a(speed, dtype=float)  # TP GPUs, each at the engine's speed
    memory_bytes_s = a(bandwidth_gbs, dtype=float) * 1e9 * a(bandwidth, dtype=float) * scale
    return Rates(
        gemm_flops=a(gemm_peak_tflops, dtype=float) * 1e12 * a(compute, dtype=float) * scale,
        attn_flops=a(bf16_peak_tflops, dtype=float)
        * 1e12
        * a(compute_bf16, dtype=float)
        * structure.attn_efficiency
        * scale,
        weight_bytes_s=memory_bytes_s,
        kv_bytes_s=memory_bytes_s * structure.kv_read_efficiency,
        link_bytes_s=a(link_gbs, dtype=float) * 1e9 * a(link, dtype=float),
        allreduce_latency_s=a(allreduce_latency_s, dtype=float),
        ring_hop_latency_s=a(ring_hop_latency_s, dtype=float),
        oneshot_max_bytes=a(oneshot_max_bytes, dtype=float),
        custom_max_bytes=a(custom_max_bytes, dtype=float),
        overhead_s=a(overhead_ms, dtype=float) * 1e-3,
        seq_overhead_s=a(seq_overhead_us, dtype=float) * 1e-6,
        gemm_half_tokens=a(structure.gemm_half_tokens if gemm_half_tokens is None else gemm_half_tokens, dtype=float),
        roofline_p=a(structure.roofline_p, dtype=float),
        moe_efficiency=a(structure.moe_efficiency, dtype=float),
        pp_serial=a(structure.pp_serial, dtype=float),
    )


#: bytes per logit in the engine's output buffer (FP32)
LOGIT_BYTES = 4.0


def workspace_gb(model: ModelSpec, engine: EngineSpec, tp: int) -> float:
    """Activation and logits buffers an engine sizes for its limits before it carves the KV pool, GB per GPU.

    TensorRT-LLM allocates them up front for ``max_num_tokens`` (each token: the residual stream and
    attention output, ``2 x hidden``, plus its shard of the MLP's gate and up projections,
    ``2 x ffn / tp``, 16-bit) and for ``max_batch_size`` sequences of FP32 logits over the vocabulary.
    On a tight fit (a 70B FP8 model on one 80 GB GPU) this is a quarter of what is left for KV.
    """
    act = engine.max_step_tokens * (2.0 * model.hidden + 2.0 * model.ffn / tp) * 2.0
    logits = engine.max_batch * model.vocab * LOGIT_BYTES
    return (act + logits) / 1e9


def kv_pool_gb(
    model: ModelSpec, gpu: GPUSpec, tp: int, weights_gb: float, engine: EngineSpec | None, mem_fraction: float
) -> float:
    """KV pool per GPU under the engine's memory rule (SGLang/vLLM: share of all; TensorRT-LLM: of free
    memory after its :func:`workspace_gb` buffers)."""
    device = gpu.memory_gb * GIB / 1e9
    if engine is not None and engine.kv_free_fraction is not None:
        free = device - weights_gb - RUNTIME_RESERVE_GB - workspace_gb(model, engine, tp)
        return free * engine.kv_free_fraction
    frac = engine.mem_fraction if engine is not None and engine.mem_fraction is not None else mem_fraction
    return device * frac - RUNTIME_RESERVE_GB - weights_gb


@dataclass(frozen=True)
class ReplicaPerf:
    """Timing and memory of one replica. All times in seconds, all arrays broadcast (numpy)."""

    model: ModelSpec
    gpu: GPUSpec
    tp: int
    pp: int
    dtype: str
    kv_dtype: str
    fits: bool
    reason: str
    weights_gb_per_gpu: float
    kv_gb_per_gpu: float
    kv_capacity_tokens: int
    kv_bytes_per_token_per_gpu: float
    rates: Rates
    shape: Shape

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def step_overhead_s(self) -> float:
        return float(self.rates.overhead_s)

    def step_time(
        self, tokens: ArrayLike, ctx: ArrayLike = 0.0, sq: ArrayLike = 0.0, *, pipelined: bool = False
    ) -> np.ndarray:
        """One step over ``tokens`` new tokens with ``ctx`` KV tokens read (see :mod:`boute.perf.physics`)."""
        return step_time(self.rates, self.shape, tokens, ctx, sq, pipelined=pipelined)

    def prefill_time(
        self, tokens: ArrayLike, sum_sq_len: ArrayLike | None = None, prompts: ArrayLike | None = None
    ) -> np.ndarray:
        """One forward pass over ``tokens`` new prompt tokens (a batch or a chunk).

        ``sum_sq_len`` is the sum over prompts of (length^2), the causal attention term; if omitted the
        tokens are taken as one prompt. ``prompts`` (each pays the per-sequence cost) defaults to the
        count of equal-length prompts with those sums, ``tokens^2 / sum_sq_len``.
        """
        t = np.asarray(tokens, dtype=float)
        sq = t * t if sum_sq_len is None else np.asarray(sum_sq_len, dtype=float)
        if prompts is None:
            prompts = np.clip(t**2 / np.maximum(sq, 1.0), 1.0, np.maximum(t, 1.0))
        return step_time(self.rates, self.shape, t, 0.0, sq, seqs=prompts)

    def decode_step_time(self, batch: ArrayLike, context_tokens: ArrayLike) -> np.ndarray:
        """One decode iteration for ``batch`` sequences whose contexts sum to ``context_tokens``."""
        return step_time(self.rates, self.shape, batch, context_tokens, 0.0)

    def max_batch(self, input_len: float, output_len: float) -> int:
        """Concurrent requests whose full KV (input + output tokens) fits in the pool."""
        if not self.fits:
            return 0
        return int(self.kv_capacity_tokens // max(1.0, input_len + output_len))

    def static_batch(self, batch: int, input_len: float, output_len: float) -> dict[str, float]:
        """A static batch (TensorRT-LLM benchmark style): all prompts prefilled, then decoded together.

        The batch is capped at :meth:`max_batch`; ``output_tokens_per_s`` counts generated tokens over
        prefill + decode time, as published serving tables do.
        """
        from boute.perf.serving import static_batch

        b = max(1, min(int(batch), self.max_batch(input_len, output_len))) if self.fits else 0
        if b == 0:
            return {"batch": 0, "ttft_ms": math.nan, "tpot_ms": math.nan, "output_tokens_per_s": 0.0}
        ttft, tpot, thr = static_batch(self.rates, self.shape, b, input_len, output_len)
        return {
            "batch": b,
            "ttft_ms": float(ttft) * 1e3,
            "tpot_ms": float(tpot) * 1e3,
            "e2e_ms": (float(ttft) + float(tpot) * max(0.0, output_len - 1)) * 1e3,
            "output_tokens_per_s": float(thr),
        }


def replica_perf(
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int = 1,
    pp: int = 1,
    dtype: str = "bf16",
    mem_fraction: float = DEFAULT_MEM_FRACTION,
    *,
    kv_dtype: str | None = None,
    engine: EngineSpec | None = None,
    structure: Structure | None = None,
    efficiency: Efficiency | None = None,
    speed: float = 1.0,
) -> ReplicaPerf:
    """Build the performance model of one replica; never raises for infeasible configs.

    ``fits`` is False (with ``reason``) when TP does not divide the heads, the GPU lacks the dtype, the
    replica spans more GPUs than a node holds, or the weights leave too little room for KV cache.
    ``engine`` (default: SGLang's rules via ``mem_fraction``) sets the memory rule and, if given, the
    engine's fitted step overhead instead of the GPU's ``step_overhead_ms``. ``speed``: the engine's kernel
    speed against the reference (:func:`make_rates`; 1 for BOute's own engine).
    """
    kv_dtype = _checked_dtypes(dtype, kv_dtype, mem_fraction)
    st = structure or packaged_structure()
    eff = efficiency or gpu.efficiency
    reasons = _layout_misfits(model, gpu, tp, pp)
    peak = peak_tflops(gpu, dtype)
    if peak is None:
        reasons.append(f"{gpu.name} has no {dtype.upper()} support")
        peak = gpu.tflops_bf16
    n = tp * pp
    weights_gb = weight_bytes(model, dtype)[0] / 1e9 / n
    shape = model_shape(model, tp, pp, dtype, kv_dtype, engine.gqa_kv_sharing if engine is not None else True)
    # stored KV per GPU: layers and heads split over the tp x pp GPUs (KV heads replicate when tp > kv_heads)
    kv_per_tok = 2.0 * model.layers * math.ceil(model.kv_heads / tp) * model.head_dim * KV_DTYPE_BYTES[kv_dtype] / pp
    kv_gb = kv_pool_gb(model, gpu, tp, weights_gb, engine, mem_fraction)
    kv_tokens = int(max(0.0, kv_gb) * 1e9 // kv_per_tok)
    if not reasons and kv_tokens < MIN_KV_TOKENS:
        reasons.append(
            f"weights need {weights_gb:.1f} GB/GPU of {gpu.memory_gb:g} GB, leaving KV room for "
            f"{kv_tokens} tokens (< {MIN_KV_TOKENS})"
        )
    return ReplicaPerf(
        model=model,
        gpu=gpu,
        tp=tp,
        pp=pp,
        dtype=dtype,
        kv_dtype=kv_dtype,
        fits=not reasons,
        reason="; ".join(reasons),
        weights_gb_per_gpu=weights_gb,
        kv_gb_per_gpu=max(0.0, kv_gb),
        kv_capacity_tokens=kv_tokens if not reasons else 0,
        kv_bytes_per_token_per_gpu=kv_per_tok,
        rates=_replica_rates(gpu, tp, dtype, peak, engine, st, eff, speed),
        shape=shape,
    )


def _checked_dtypes(dtype: str, kv_dtype: str | None, mem_fraction: float) -> str:
    """The KV dtype (``dtype``'s default when None); ValueError for an unknown dtype or a memory share
    outside (0, 1]."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got '{dtype}'")
    kv_dtype = kv_dtype or default_kv_dtype(dtype)
    if kv_dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"kv_dtype must be one of {sorted(KV_DTYPE_BYTES)}, got '{kv_dtype}'")
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    return kv_dtype


def _layout_misfits(model: ModelSpec, gpu: GPUSpec, tp: int, pp: int) -> list[str]:
    """Why the tp x pp layout cannot hold the model on this GPU type (empty when it can)."""
    reasons: list[str] = []
    if model.heads % tp:
        reasons.append(f"tp={tp} does not divide {model.heads} attention heads")
    if pp > model.layers:
        reasons.append(f"pp={pp} exceeds {model.layers} layers")
    if tp * pp > gpu.gpus_per_node:
        reasons.append(f"tp*pp={tp * pp} exceeds {gpu.gpus_per_node} GPUs per node")
    return reasons


def _replica_rates(
    gpu: GPUSpec,
    tp: int,
    dtype: str,
    peak: float,
    engine: EngineSpec | None,
    st: Structure,
    eff: Efficiency,
    speed: float,
) -> Rates:
    """The replica's effective rates (:func:`make_rates`): the GPU's peaks scaled by its efficiency factors,
    with the engine's fitted step overhead where an engine is given (else the GPU's)."""
    overhead = st.overhead_ms(engine.overhead_key) if engine is not None else eff.step_overhead_ms
    seq_overhead = st.seq_overhead_us_for(engine.overhead_key if engine is not None else "sglang")
    return make_rates(
        gemm_peak_tflops=peak,
        bf16_peak_tflops=gpu.tflops_bf16,
        bandwidth_gbs=gpu.bandwidth_gbs,
        link_gbs=gpu.link_gbs,
        tp=tp,
        compute=eff.compute_for(dtype),
        compute_bf16=eff.compute,
        bandwidth=eff.bandwidth,
        link=eff.link,
        overhead_ms=overhead,
        allreduce_latency_s=st.allreduce_latency_s(gpu.link),
        structure=st,
        seq_overhead_us=seq_overhead,
        gemm_half_tokens=eff.gemm_half_tokens,
        ring_hop_latency_s=st.ring_hop_latency_s(gpu.link),
        **allreduce_limits(engine, gpu, tp),
        speed=speed,
    )
