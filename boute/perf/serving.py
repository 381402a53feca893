"""Serving regimes built on the step time: static batches, saturated engines, steady serving points.

These are the ways published benchmarks run an engine, so they are what the model is checked against,
and the steady-state serving point is also what the simulator's fast path reasons with:

- :func:`static_batch` - every prompt prefilled in one pass, then the batch decodes together
  (TensorRT-LLM's static benchmarks up to v0.9).
- :func:`saturated_throughput` - an engine fed faster than it serves (``trtllm-bench throughput``, vLLM
  offline): the KV pool (or the batch cap) holds ``B`` sequences, each step decodes them and prefills
  the prompts that replace the ones that finished. With mixed prefill, the step carries both; without,
  a separate prefill pass stalls decoding. The step-token cap bounds the decode batch when prompts
  are long.
- :func:`serving_point` - steady serving at an arrival rate (open loop) or a number of users (closed
  loop). Each arriving prompt adds ``delta`` seconds to the step(s) that carry it (mixed: the extra
  cost of its tokens in a decode step; separate: a whole prefill pass), so the mean step is
  ``s = s0 / (1 - rate x delta)`` - the chunked-prefill interference the decode tokens see - and
  Little's law gives the decoding batch ``rate x (out - 1) x s``, solved as a fixed point.

All functions take arrays (one element per replica/row) so the fit evaluates every published row at once.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from boute.perf.physics import Rates, Shape, step_time

#: Gauss-Legendre nodes/weights on [0, 1]: the mean of a smooth function over a decode run from 4 points
_GL_X = (np.array([-0.861136311594053, -0.339981043584856, 0.339981043584856, 0.861136311594053]) + 1.0) / 2.0
_GL_W = np.array([0.347854845137454, 0.652145154862546, 0.652145154862546, 0.347854845137454]) / 2.0
#: utilisation of the step budget beyond which a serving point counts as unstable
MAX_LOAD = 0.98


def _f(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=float)


def static_batch(
    rates: Rates, shape: Shape, batch: ArrayLike, input_len: ArrayLike, output_len: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(TTFT s, mean decode step s, output tokens/s) of a static batch: one prefill pass, then decode."""
    b, i, o = _f(batch), _f(input_len), _f(output_len)
    ttft = step_time(rates, shape, b * i, 0.0, b * i * i, seqs=b)
    span = np.maximum(o - 1.0, 0.0)
    tpot = sum(w * step_time(rates, shape, b, b * (i + x * span)) for x, w in zip(_GL_X, _GL_W, strict=True))
    total = ttft + tpot * span
    return ttft, tpot, b * o / total


def _prefill_chunks(tokens: np.ndarray, cap: np.ndarray) -> np.ndarray:
    return np.maximum(1.0, np.ceil(tokens / cap))


def saturated_throughput(
    rates: Rates,
    shape: Shape,
    input_len: ArrayLike,
    output_len: ArrayLike,
    *,
    kv_tokens: ArrayLike,
    max_batch: ArrayLike,
    max_step_tokens: ArrayLike,
    mixed: ArrayLike,
    reserve_output: ArrayLike,
) -> np.ndarray:
    """Output tokens/s of a replica fed faster than it serves (pipeline stages kept busy).

    Sequences in flight: ``B = min(max_batch, KV / (in + out))`` (or ``in + out/2`` when the engine pages
    on demand). Per step, ``d`` sequences decode and ``d / out`` prompts of ``in`` tokens are prefilled to
    replace those that finish; the step-token cap limits ``d (1 + in/out)`` when mixed.
    """
    i, o = _f(input_len), _f(output_len)
    per_seq = np.where(np.asarray(reserve_output, dtype=bool), i + o, i + 0.5 * o)
    b = np.maximum(1.0, np.minimum(_f(max_batch), np.floor(_f(kv_tokens) / per_seq)))
    cap = _f(max_step_tokens)
    mix = np.asarray(mixed, dtype=bool)
    d = np.where(mix, np.minimum(b, cap / (1.0 + i / o)), b)
    d = np.maximum(d, 1.0)
    prompts = d / o
    ctx = d * (i + 0.5 * o)
    mixed_step = step_time(rates, shape, d + prompts * i, ctx, prompts * i * i, seqs=d + prompts, pipelined=True)
    pf_tokens = prompts * i
    k = _prefill_chunks(pf_tokens, cap)
    split = step_time(rates, shape, d, ctx, pipelined=True) + k * step_time(
        rates, shape, pf_tokens / k, 0.0, prompts * i * i / k, seqs=prompts / k, pipelined=True
    )
    return d / np.where(mix, mixed_step, split)


def prompt_delta(
    rates: Rates,
    shape: Shape,
    batch: ArrayLike,
    ctx: ArrayLike,
    input_len: ArrayLike,
    *,
    max_step_tokens: ArrayLike,
    mixed: ArrayLike,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(plain decode step s0, extra seconds one prompt adds to the steps that carry it, its chunks).

    Mixed: the prompt's tokens ride in ``k`` decode steps, each costing ``step(d + in/k) - step(d)`` more.
    Separate: ``k`` prefill passes of their own (decode waits).
    """
    d, c, i = _f(batch), _f(ctx), _f(input_len)
    cap = _f(max_step_tokens)
    k = _prefill_chunks(i, cap)
    s0 = step_time(rates, shape, np.maximum(d, 1.0), c)
    with_prompt = step_time(rates, shape, np.maximum(d, 0.0) + i / k, c, i * i / k, seqs=np.maximum(d, 0.0) + 1.0)
    alone = step_time(rates, shape, i / k, 0.0, i * i / k, seqs=1.0)
    mix = np.asarray(mixed, dtype=bool)
    delta = k * np.where(mix, with_prompt - np.where(d > 0, s0, 0.0), alone)
    return s0, delta, k


def _busy(batch: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Probability that an arriving prompt finds a step in progress (and waits for half of it on average).

    The engine idles when no sequence decodes and no prompt is being prefilled. Decoding sequences in
    steady state are Poisson-distributed around their mean ``batch`` (an M/G/inf population), so none
    decodes with probability ``exp(-batch)``; prefill takes the share ``load`` of the time. At low load
    with short answers the engine is mostly idle and a prompt starts at once: charging every arrival half
    a step over-predicted those published first-token times by 25-35%.
    """
    return 1.0 - np.exp(-np.maximum(batch, 0.0)) * (1.0 - np.clip(load, 0.0, 1.0))


def serving_point(
    rates: Rates,
    shape: Shape,
    input_len: ArrayLike,
    output_len: ArrayLike,
    *,
    rate: ArrayLike | None = None,
    concurrency: ArrayLike | None = None,
    max_step_tokens: ArrayLike,
    mixed: ArrayLike,
    iters: int = 60,
) -> dict[str, np.ndarray]:
    """Steady serving at ``rate`` req/s (open loop) or with ``concurrency`` users (closed loop).

    Returns mean TTFT (s), mean inter-token time ``itl`` (s), decoding batch, request rate and the load
    ``rate x delta`` (the share of step time spent on prefill); ``stable`` is False where that load
    reaches :data:`MAX_LOAD`. Mean values only: no queueing for KV slots (see the fast path for that).
    """
    if (rate is None) == (concurrency is None):
        raise ValueError("give exactly one of rate (open loop) or concurrency (closed loop)")
    i, o = _f(input_len), _f(output_len)
    closed = concurrency is not None
    n = _f(concurrency) if concurrency is not None else np.zeros(1)
    lam = _f(rate) if rate is not None else np.ones_like(i)
    mix = np.asarray(mixed, dtype=bool)

    def first_token(
        d: np.ndarray, load: np.ndarray, s: np.ndarray, s0: np.ndarray, delta: np.ndarray, k: np.ndarray
    ) -> np.ndarray:
        """Mean TTFT: half a step if one runs, the prompt's own cost, and (mixed) its chunks' decode steps."""
        return _busy(d, load) * 0.5 * s + delta + np.where(mix, k * s0, 0.0)

    d = np.ones(np.broadcast(i, o, lam).shape)
    for _ in range(iters):
        ctx = d * (i + 0.5 * o)
        s0, delta, k = prompt_delta(rates, shape, d, ctx, i, max_step_tokens=max_step_tokens, mixed=mixed)
        load = np.minimum(lam * delta, MAX_LOAD)
        s = s0 / (1.0 - load)
        ttft = first_token(d, load, s, s0, delta, k)
        if closed:
            cycle = ttft + (o - 1.0) * s
            lam = 0.5 * lam + 0.5 * (n / cycle)  # damped: the users' request rate follows their cycle
            d_new = n * (o - 1.0) * s / cycle
        else:
            d_new = lam * (o - 1.0) * s
        d = 0.5 * d + 0.5 * np.maximum(d_new, 0.0)
    ctx = d * (i + 0.5 * o)
    s0, delta, k = prompt_delta(rates, shape, d, ctx, i, max_step_tokens=max_step_tokens, mixed=mixed)
    raw_load = lam * delta
    s = s0 / (1.0 - np.minimum(raw_load, MAX_LOAD))
    ttft = first_token(d, raw_load, s, s0, delta, k)
    return {
        "ttft_s": ttft,
        "itl_s": s,
        "batch": d,
        "rate": lam,
        "load": raw_load,
        "stable": raw_load < MAX_LOAD,
        "output_tokens_per_s": lam * o,
    }
