"""Analytical performance model of one serving replica (model x GPU type x TP x PP x dtype).

A roofline model: a forward pass costs ``max(compute, memory)`` time plus communication and a fixed
per-iteration overhead. Prefill is compute-bound (2 * active params FLOPs per token plus attention);
decode is memory-bound (weights once per iteration plus the KV cache of every sequence in the batch).
Datasheet peaks are scaled by per-GPU efficiency factors (``GPUSpec.efficiency``) that calibration files
override. Approximate by design: it is meant to rank plans correctly and land within ~20% of
measurements after calibration, not to replace profiling.

Pipeline parallelism splits the layers (and so the memory) over ``pp`` GPUs; it does not shorten a
forward pass, it adds a hand-off per stage boundary. Tensor parallelism divides compute, weights and KV
heads over ``tp`` GPUs and adds two all-reduces per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from boute.catalog.schema import GPUSpec, ModelSpec

Dtype = Literal["bf16", "fp8"]
DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0}

#: share of GPU memory SGLang's static pool may use (``--mem-fraction-static`` is ~0.88 by default)
DEFAULT_MEM_FRACTION = 0.88
#: datasheet "80 GB" of device memory is 80 GiB (an A100 80GB shows 81,920 MiB); weights/KV are in 1e9-byte GB
GIB = 2.0**30
#: sharpness of the roofline's smooth maximum: time = (compute^p + memory^p)^(1/p). p -> inf is the ideal
#: max(compute, memory); p = 1 adds them (no overlap). Chosen among {1, 1.5, 2, 3, inf} on the published
#: TensorRT-LLM rows: p = 1 fits them best and transfers best to held-out rows (docs/perf-model.md)
ROOFLINE_SHARPNESS = 1.0
#: activations, CUDA graphs, allocator slack kept outside the pool, GB per GPU
RUNTIME_RESERVE_GB = 1.5
#: below this many KV tokens a replica cannot serve realistic requests: treated as not fitting
MIN_KV_TOKENS = 4096
#: fixed latency of one collective / point-to-point message, seconds, by link family
LINK_LATENCY_S = {"nvlink": 8e-6, "pcie": 25e-6, "cpu": 0.0}


def roofline(compute_s: np.ndarray, memory_s: np.ndarray) -> np.ndarray:
    """Smooth maximum of the compute and memory times of one forward pass (see ``ROOFLINE_SHARPNESS``)."""
    p = ROOFLINE_SHARPNESS
    hi = np.maximum(compute_s, memory_s)
    safe = np.where(hi > 0, hi, 1.0)
    return np.where(hi > 0, safe * ((compute_s / safe) ** p + (memory_s / safe) ** p) ** (1.0 / p), 0.0)


def _link_latency(link: str) -> float:
    for prefix, lat in LINK_LATENCY_S.items():
        if link.startswith(prefix):
            return lat
    return LINK_LATENCY_S["pcie"]


@dataclass(frozen=True)
class ReplicaPerf:
    """Timing and memory of one replica. All times in seconds, all arrays broadcast (numpy)."""

    model: ModelSpec
    gpu: GPUSpec
    tp: int
    pp: int
    dtype: str
    fits: bool
    reason: str
    weights_gb_per_gpu: float
    kv_gb_per_gpu: float
    kv_capacity_tokens: int
    kv_bytes_per_token_per_gpu: float
    # effective rates (datasheet x efficiency), per replica
    flops_per_s: float  # GEMMs in ``dtype``
    attn_flops_per_s: float  # attention stays 16-bit even in FP8 mode
    bytes_per_s: float
    link_bytes_per_s: float
    step_overhead_s: float

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    # ---- building blocks ------------------------------------------------------------------------
    def _comm_time(self, tokens: ArrayLike) -> np.ndarray:
        """TP all-reduces (2 per layer, ring) + PP hand-offs for ``tokens`` activations in flight."""
        tokens = np.asarray(tokens, dtype=float)
        act_bytes = tokens * self.model.hidden * 2.0  # activations stay in 16-bit
        lat = _link_latency(self.gpu.link)
        t = np.zeros_like(tokens)
        if self.tp > 1:
            per_ar = 2.0 * (self.tp - 1) / self.tp * act_bytes / self.link_bytes_per_s + lat * (self.tp - 1)
            t = t + 2.0 * self.model.layers * per_ar
        if self.pp > 1:
            t = t + (self.pp - 1) * (act_bytes / self.link_bytes_per_s + lat)
        return t

    def _weight_bytes_read(self, batch: ArrayLike) -> np.ndarray:
        """Weight bytes read per iteration over all layers and TP ranks (divided by the TP group's bandwidth).

        For MoE only the experts some token in the batch routes to are read: with k of E experts per
        token chosen uniformly, a batch of b tokens touches a share 1 - (1 - k/E)^b of them.
        """
        m = self.model
        b = np.asarray(batch, dtype=float)
        total = m.params_b * 1e9 * DTYPE_BYTES[self.dtype]
        if not m.is_moe:
            return np.full_like(b, total)
        active = m.compute_params_b * 1e9 * DTYPE_BYTES[self.dtype]
        per_expert = (total - active) / (m.num_experts - m.experts_per_token)
        shared = total - per_expert * m.num_experts
        touched = m.num_experts * (1.0 - (1.0 - m.experts_per_token / m.num_experts) ** np.maximum(b, 1.0))
        return shared + per_expert * touched

    # ---- the two phases -------------------------------------------------------------------------
    def prefill_time(self, tokens: ArrayLike, sum_sq_len: ArrayLike | None = None) -> np.ndarray:
        """One forward pass over ``tokens`` new prompt tokens (a batch or a chunk).

        ``sum_sq_len`` is the sum over prompts of (length^2), the causal attention term; if omitted the
        tokens are taken as one prompt.
        """
        m = self.model
        t = np.asarray(tokens, dtype=float)
        sq = t * t if sum_sq_len is None else np.asarray(sum_sq_len, dtype=float)
        # causal attention: QK^T and AV over half the (length x length) score matrix, 2 FLOPs per MAC
        attn = 2.0 * m.layers * m.heads * m.head_dim * sq
        compute = 2.0 * m.compute_params_b * 1e9 * t / self.flops_per_s + attn / self.attn_flops_per_s
        memory = self._weight_bytes_read(t) / self.bytes_per_s
        return self.step_overhead_s + roofline(compute, memory) + self._comm_time(t)

    def decode_step_time(self, batch: ArrayLike, context_tokens: ArrayLike) -> np.ndarray:
        """One decode iteration for ``batch`` sequences whose contexts sum to ``context_tokens``."""
        m = self.model
        b = np.asarray(batch, dtype=float)
        ctx = np.asarray(context_tokens, dtype=float)
        attn = 4.0 * m.layers * m.heads * m.head_dim * ctx
        compute = 2.0 * m.compute_params_b * 1e9 * b / self.flops_per_s + attn / self.attn_flops_per_s
        # every stage is traversed in turn; KV heads replicate when tp > kv_heads
        kv_bytes = ctx * self.kv_bytes_per_token_per_gpu * self.pp * self.tp
        memory = (self._weight_bytes_read(b) + kv_bytes) / self.bytes_per_s
        t = self.step_overhead_s + roofline(compute, memory) + self._comm_time(b)
        return np.where(b > 0, t, 0.0)

    # ---- summaries --------------------------------------------------------------------------------
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
        b = max(1, min(int(batch), self.max_batch(input_len, output_len))) if self.fits else 0
        if b == 0:
            return {"batch": 0, "ttft_ms": math.nan, "tpot_ms": math.nan, "output_tokens_per_s": 0.0}
        ttft = float(self.prefill_time(b * input_len, b * input_len**2))
        steps = np.arange(int(max(1, output_len)), dtype=float)
        tpot = float(np.mean(self.decode_step_time(np.full_like(steps, b), b * (input_len + steps))))
        total = ttft + tpot * max(0.0, output_len - 1)
        return {
            "batch": b,
            "ttft_ms": ttft * 1e3,
            "tpot_ms": tpot * 1e3,
            "e2e_ms": total * 1e3,
            "output_tokens_per_s": b * output_len / total,
        }


def replica_perf(
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int = 1,
    pp: int = 1,
    dtype: str = "bf16",
    mem_fraction: float = DEFAULT_MEM_FRACTION,
) -> ReplicaPerf:
    """Build the performance model of one replica; never raises for infeasible configs.

    ``fits`` is False (with ``reason``) when TP does not divide the heads, the GPU lacks FP8, the replica
    spans more GPUs than a node holds, or the weights leave too little room for KV cache.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got '{dtype}'")
    eff = gpu.efficiency
    reasons: list[str] = []
    if model.heads % tp:
        reasons.append(f"tp={tp} does not divide {model.heads} attention heads")
    if pp > model.layers:
        reasons.append(f"pp={pp} exceeds {model.layers} layers")
    if tp * pp > gpu.gpus_per_node:
        reasons.append(f"tp*pp={tp * pp} exceeds {gpu.gpus_per_node} GPUs per node")
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    gemm_flops = gpu.tflops_bf16 * eff.compute
    if dtype == "fp8":
        if gpu.tflops_fp8 is None:
            reasons.append(f"{gpu.name} has no FP8 support")
        else:
            gemm_flops = gpu.tflops_fp8 * eff.compute_for("fp8")
    n = tp * pp
    # weights split evenly over the tp x pp GPUs; KV heads replicate when tp > kv_heads
    weights_gb = model.params_b * DTYPE_BYTES[dtype] / n
    kv_heads_per_gpu = math.ceil(model.kv_heads / tp)
    layers_per_gpu = math.ceil(model.layers / pp)
    kv_per_tok = 2.0 * layers_per_gpu * kv_heads_per_gpu * model.head_dim * DTYPE_BYTES[dtype]
    kv_gb = (gpu.memory_gb * GIB * mem_fraction) / 1e9 - RUNTIME_RESERVE_GB - weights_gb
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
        fits=not reasons,
        reason="; ".join(reasons),
        weights_gb_per_gpu=weights_gb,
        kv_gb_per_gpu=max(0.0, kv_gb),
        kv_capacity_tokens=kv_tokens if not reasons else 0,
        kv_bytes_per_token_per_gpu=kv_per_tok,
        flops_per_s=gemm_flops * 1e12 * tp,
        attn_flops_per_s=gpu.tflops_bf16 * eff.compute * 1e12 * tp,
        bytes_per_s=gpu.bandwidth_gbs * 1e9 * eff.bandwidth * tp,
        link_bytes_per_s=gpu.link_gbs * 1e9 * eff.link,
        step_overhead_s=eff.step_overhead_ms * 1e-3,
    )
