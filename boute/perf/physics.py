"""Time of one forward pass (an engine "step"): the single rule every prediction of ``boute.perf`` uses.

A step processes ``tokens`` new tokens (decode tokens, prompt tokens, or both when an engine mixes them),
reads the KV cache of ``ctx`` context tokens, and runs causal attention over prompts whose squared lengths
sum to ``sq``. Its time is::

    overhead + roofline(compute, memory) + communication

- **compute** = GEMMs + attention. Routed-expert GEMMs of an MoE run at ``moe_efficiency`` of the dense
  rate (grouped GEMMs over few tokens per expert). GEMMs cost ``2 x active params x (tokens + gemm_half_tokens)`` FLOPs at
  the dtype's peak x efficiency: a GEMM with few rows (a small decode batch) cannot fill the tensor cores,
  and reaches ``tokens / (tokens + gemm_half_tokens)`` of its large-batch efficiency. Writing that as extra
  work of ``gemm_half_tokens`` rows keeps the term linear. Attention FLOPs (prefill: ``2 L H d sq``,
  causal; decode: ``4 L H d ctx``) run at the 16-bit peak x compute efficiency x ``attn_efficiency``
  (flash-attention kernels reach less of peak than GEMMs, more so on short sequences).
- **memory** = weight bytes read (an MoE reads only the experts its tokens route to) at the weight
  bandwidth, plus KV bytes read at ``kv_read_efficiency`` x that bandwidth (paged KV gathers are less
  regular than weight streaming).
- **roofline** = ``(compute^p + memory^p)^(1/p)``: p = 1 means no overlap, p -> inf perfect overlap;
  fitted on published rows.
- **overhead**: a fixed cost per step (launches, scheduling) plus a cost per sequence in the step
  (per-request scheduling, sampling, streaming), both fitted per engine.
- **communication**: per layer two all-reduces of ``tokens x hidden x 2`` bytes, each by the kernel
  the engine picks for that size (:func:`allreduce_time`): small messages as one-shot kernels in which
  every GPU reads its peers directly (one synchronisation whose latency grows as ``log2 tp``, like a
  barrier tree: held-out TPOT error on the first 919 published rows 22% with a per-hop latency, 10% with
  a fixed one; the TP 4-8 inter-token times of dataset version 3 want the growth), large ones through
  NCCL's ring (``2 (tp - 1)`` hops, each with its latency, by the faster of NCCL's Simple and LL
  protocols); pipeline stages add one hand-off each (a NCCL send: one hop).

Arrays broadcast, so the fit evaluates hundreds of published rows in one call, and a
:class:`~boute.perf.model.ReplicaPerf` evaluates one replica with 0-d arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

#: bytes per weight: NVFP4 stores 4-bit values plus one FP8 scale per 16 values (4.5 bits)
DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625}
#: bytes per KV-cache element
KV_DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0}


def default_kv_dtype(dtype: str) -> str:
    """KV dtype an engine uses for weights in ``dtype``: FP8 checkpoints (and FP4 ones) keep an FP8 cache."""
    return "fp8" if dtype in ("fp8", "fp4") else "bf16"


@dataclass(frozen=True)
class Rates:
    """Effective rates of one replica (or, as arrays, of many): datasheet peak x efficiency x GPUs."""

    gemm_flops: np.ndarray  # FLOP/s of GEMMs in the weight dtype, whole TP group
    attn_flops: np.ndarray  # FLOP/s of attention (16-bit), whole TP group
    weight_bytes_s: np.ndarray  # bytes/s streaming weights, whole TP group
    kv_bytes_s: np.ndarray  # bytes/s reading the KV cache, whole TP group
    link_bytes_s: np.ndarray  # bytes/s per direction of one GPU's link
    allreduce_latency_s: np.ndarray  # synchronisation of one custom-kernel all-reduce at TP 2 (NVLink)
    ring_hop_latency_s: np.ndarray  # one NCCL transfer: each of a ring all-reduce's 2 (tp - 1) hops, a PP hand-off
    oneshot_max_bytes: np.ndarray  # messages below: the engine's one-shot kernel (an engine rule, not a rate)
    custom_max_bytes: np.ndarray  # below (and above the one-shot limit): its two-shot kernel; beyond: NCCL
    overhead_s: np.ndarray  # fixed cost of a step (scheduler, launches)
    seq_overhead_s: np.ndarray  # cost per sequence in a step (scheduling, sampling, streaming each request)
    gemm_half_tokens: np.ndarray  # tokens at which GEMMs reach half their large-batch efficiency
    roofline_p: np.ndarray  # overlap sharpness
    moe_efficiency: np.ndarray  # routed-expert (grouped) GEMM efficiency relative to dense GEMMs
    pp_serial: np.ndarray  # share of a step that pipeline stages cannot overlap (bubbles, sync)


@dataclass(frozen=True)
class Shape:
    """What a replica computes per token: the model split over ``tp x pp`` GPUs."""

    compute_params: np.ndarray  # active parameters (FLOPs per token / 2)
    expert_compute_params: np.ndarray  # of which in routed experts (0 for dense models)
    weight_bytes: np.ndarray  # weights a step streams, bytes (all but the input embedding table)
    expert_bytes: np.ndarray  # bytes of one routed expert (0 for dense models)
    num_experts: np.ndarray  # routed experts (1 for dense)
    experts_per_token: np.ndarray
    attn_coef: np.ndarray  # layers x heads x head_dim
    act_bytes_per_token: np.ndarray  # hidden x 2 (activations stay 16-bit)
    kv_bytes_per_token: np.ndarray  # KV bytes per context token over the whole replica (replicated heads counted)
    layers: np.ndarray
    tp: np.ndarray
    pp: np.ndarray


def roofline(compute_s: ArrayLike, memory_s: ArrayLike, p: ArrayLike) -> np.ndarray:
    """Smooth maximum ``(c^p + m^p)^(1/p)`` of the compute and memory times of one step."""
    c = np.asarray(compute_s, dtype=float)
    m = np.asarray(memory_s, dtype=float)
    hi = np.maximum(c, m)
    safe = np.where(hi > 0, hi, 1.0)
    pp = np.asarray(p, dtype=float)
    return np.where(hi > 0, safe * ((c / safe) ** pp + (m / safe) ** pp) ** (1.0 / pp), 0.0)


def weight_bytes_read(shape: Shape, tokens: ArrayLike) -> np.ndarray:
    """Weight bytes a step reads: all of a dense model; the shared part plus touched experts of an MoE.

    With k of E experts per token chosen uniformly, ``t`` tokens touch a share ``1 - (1 - k/E)^t`` of them.
    """
    t = np.maximum(np.asarray(tokens, dtype=float), 1.0)
    e = shape.num_experts
    moe = e > 1
    share = np.where(moe, 1.0 - (1.0 - shape.experts_per_token / np.maximum(e, 1.0)) ** t, 1.0)
    shared = shape.weight_bytes - shape.expert_bytes * e
    return np.where(moe, shared + shape.expert_bytes * e * share, shape.weight_bytes)


#: NCCL's LL protocol against its Simple one in NCCL's own tuning model (``src/graph/tuning.cc``, ring
#: all-reduce within a node): a quarter of the bus bandwidth (each 8-byte store carries 4 bytes of data and a
#: flag, and the model derates it further), and a per-step latency of 0.14 (NVLink: 0.47 us against 3.4) to
#: 0.18 (PCIe: 1.0 against 5.7) of Simple's
NCCL_LL_BYTES = 4.0
NCCL_LL_HOP = 0.16


def allreduce_time(rates: Rates, shape: Shape, act: np.ndarray) -> np.ndarray:
    """One all-reduce of ``act`` bytes per GPU, by the kernel the engine picks for that size.

    One-shot (small messages): every GPU reads its ``tp - 1`` peers' buffers, one synchronisation.
    Two-shot: reduce-scatter + all-gather, ``2 (tp - 1) / tp x bytes`` per GPU, one synchronisation.
    NCCL ring (large messages, or no NVLink): the same traffic in ``2 (tp - 1)`` hops, each paying its
    latency. The split matters at TP 8: a decode step's 10 MB message goes to NCCL and pays 14 hops,
    while a small-batch step's few kB run one-shot. NCCL itself picks its protocol by size: small messages
    go by LL (:data:`NCCL_LL_HOP` of the hop latency, :data:`NCCL_LL_BYTES` times the bytes), which is
    what a small decode step over PCIe pays (held out by source, Ada's p90 25.4% -> 23.1%).

    A synchronisation costs the fitted latency x ``log2 tp``. With one fixed latency, NIM's decode at 1-4
    users came out +15% at TP 2 and -18% at TP 8 (medians, in sample); growing as ``tp - 1`` the fit is
    worse (in-sample p90 22.3% against 21.2%).
    """
    tp = shape.tp
    ring_bytes = 2.0 * (tp - 1.0) / tp * act / rates.link_bytes_s
    sync = rates.allreduce_latency_s * np.log2(np.maximum(tp, 2.0))
    oneshot = (tp - 1.0) * act / rates.link_bytes_s + sync
    twoshot = ring_bytes + sync
    hops = 2.0 * (tp - 1.0) * rates.ring_hop_latency_s
    # NCCL's tuner takes the faster of its protocols: Simple (the fitted hop latency, full bandwidth) or LL
    nccl = np.minimum(ring_bytes + hops, NCCL_LL_BYTES * ring_bytes + NCCL_LL_HOP * hops)
    return np.where(act < rates.oneshot_max_bytes, oneshot, np.where(act < rates.custom_max_bytes, twoshot, nccl))


def comm_time(rates: Rates, shape: Shape, tokens: ArrayLike, share: ArrayLike = 1.0) -> np.ndarray:
    """TP all-reduces (two per layer, :func:`allreduce_time`) and PP hand-offs for ``tokens``.

    ``share`` < 1: one pipeline stage's layers and its one hand-off (the throughput view).
    """
    t = np.asarray(tokens, dtype=float)
    frac = np.asarray(share, dtype=float)
    act = t * shape.act_bytes_per_token
    tp, pp = shape.tp, shape.pp
    tp_part = np.where(tp > 1, 2.0 * shape.layers * frac * allreduce_time(rates, shape, act), 0.0)
    handoffs = np.where(frac < 1.0, 1.0, pp - 1.0)
    pp_part = np.where(pp > 1, handoffs * (act / rates.link_bytes_s + rates.ring_hop_latency_s), 0.0)
    return tp_part + pp_part


def _work(rates: Rates, shape: Shape, t: np.ndarray, c: np.ndarray, s2: np.ndarray, share: ArrayLike) -> np.ndarray:
    """Roofline and collectives of ``share`` of the layers over ``t`` tokens (1: the whole model)."""
    dense_params = shape.compute_params - shape.expert_compute_params
    eff_params = dense_params + shape.expert_compute_params / rates.moe_efficiency
    gemm = 2.0 * eff_params * share * (t + rates.gemm_half_tokens) / rates.gemm_flops
    attn = (2.0 * s2 + 4.0 * c) * shape.attn_coef * share / rates.attn_flops
    memory = share * (
        weight_bytes_read(shape, t) / rates.weight_bytes_s + c * shape.kv_bytes_per_token / rates.kv_bytes_s
    )
    return roofline(gemm + attn, memory, rates.roofline_p) + comm_time(rates, shape, t, share)


def step_time(
    rates: Rates,
    shape: Shape,
    tokens: ArrayLike,
    ctx: ArrayLike = 0.0,
    sq: ArrayLike = 0.0,
    *,
    seqs: ArrayLike | None = None,
    pipelined: bool = False,
) -> np.ndarray:
    """Seconds of one step over ``tokens`` new tokens, ``ctx`` KV tokens read, prompts' ``sum(len^2) = sq``.

    ``seqs``: sequences in the step, each paying the engine's per-sequence cost; None means one per
    token (a decode step). ``pipelined``: the replica's ``pp`` stages work on different micro-batches at
    once (throughput view). The batch splits into ``pp`` micro-batches; each stage runs each of them
    over its share of the layers, so one round (every token advances one step) costs ``pp`` micro-batch
    passes of one stage. Compute and KV reads divide by ``pp``; weight reads do not (each micro-batch
    streams the stage's weights again), which is why pipelining speeds up prefill almost linearly and
    memory-bound decode only through the larger batch its memory holds. ``pp_serial`` adds the bubbles
    and synchronisation that stages do not overlap; each micro-batch is an engine iteration of its own and
    pays the fixed step overhead (the v1.0 table, PP 1-8, held out: p90 35.8% -> 33.7% with it).
    Without ``pipelined`` (latency view), a token traverses the stages in turn.
    """
    t = np.asarray(tokens, dtype=float)
    c = np.asarray(ctx, dtype=float)
    s2 = np.asarray(sq, dtype=float)
    if pipelined:
        pp = shape.pp
        work = pp * _work(rates, shape, t / pp, c / pp, s2 / pp, 1.0 / pp)
        work = work * (1.0 + rates.pp_serial * (1.0 - 1.0 / pp))
    else:
        work = _work(rates, shape, t, c, s2, 1.0)
    n = t if seqs is None else np.asarray(seqs, dtype=float)
    rounds = shape.pp if pipelined else 1.0
    return np.where(t > 0, rates.overhead_s * rounds + rates.seq_overhead_s * n + work, 0.0)
