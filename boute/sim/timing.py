"""Scalar-fast views of the performance model for the event simulator and the fast path.

The simulator needs millions of step times; calling numpy per step (or per event) would dominate its run
time. Between two events a replica's batch is fixed and every decode step grows each context by one
token, so the time of ``k`` steps is a sum of ``f_B(C + B j)`` for j < k. We tabulate, once per replica
type, each batch size's step time as a function of total context: the perf model's decode step is
convex and piecewise linear in context (``max(compute, memory)`` of two lines plus constants), so the
tangent lines at zero and at the KV capacity reproduce it, and a k-step sum becomes two arithmetic series.
The linearisation error is measured on sample points at build time (``max_rel_error``) and tested.

Prefill time is tabulated over chunk sizes at the two extremes of the causal-attention term (many tiny
prompts vs one prompt) and interpolated linearly in between (exact where prefill is compute-bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from boute.perf import ReplicaPerf

#: SGLang's default --chunked-prefill-size on large GPUs
DEFAULT_CHUNK_TOKENS = 8192
#: cap on concurrently running requests per replica (SGLang derives 2048-4096 from the pool size)
DEFAULT_MAX_RUNNING = 2048


def _lin(a: float, s: float, c: float, b: int, n: int) -> float:
    """sum_{j<n} (a + s * (c + b j))."""
    return n * (a + s * c) + s * b * n * (n - 1) * 0.5


def _solve_lin(a: float, s: float, c: float, b: int, tau: float) -> int:
    """Smallest n >= 0 with _lin(a, s, c, b, n) >= tau (tau > 0)."""
    base = a + s * c
    q = 0.5 * s * b
    if q <= 0.0:
        n = math.ceil(tau / base) if base > 0 else 1
    else:
        lin = base - q
        n = math.ceil((-lin + math.sqrt(lin * lin + 4.0 * q * tau)) / (2.0 * q))
    n = max(n, 0)
    while n > 0 and _lin(a, s, c, b, n - 1) >= tau:
        n -= 1
    while _lin(a, s, c, b, n) < tau:
        n += 1
    return n


@dataclass
class ReplicaTiming:
    """Tabulated step times of one replica type (lists, for fast scalar indexing)."""

    perf: ReplicaPerf
    kv_capacity: int
    max_running: int
    chunk: int
    pf_lo: list[float]  # prefill_time(n, sum_sq = n): n one-token prompts
    pf_hi: list[float]  # prefill_time(n, sum_sq = n^2): one prompt
    a0: list[float]  # decode step of batch B: max(a0 + s0 x, a1 + s1 x), x = total context
    s0: list[float]
    a1: list[float]
    s1: list[float]
    kink: list[float]  # x where the second line takes over
    max_rel_error: float

    # ---- prefill -------------------------------------------------------------------------------
    def prefill(self, tokens: int, sum_sq: float) -> float:
        """One prefill iteration over ``tokens`` (<= chunk) new tokens with causal term ``sum_sq``."""
        lo, hi = self.pf_lo[tokens], self.pf_hi[tokens]
        span = float(tokens) * tokens - tokens
        if span <= 0.0:
            return hi
        w = (sum_sq - tokens) / span
        return lo + (hi - lo) * min(1.0, max(0.0, w))

    # ---- decode --------------------------------------------------------------------------------
    def step(self, b: int, ctx: float) -> float:
        """One decode iteration of ``b`` sequences with total context ``ctx``."""
        return max(self.a0[b] + self.s0[b] * ctx, self.a1[b] + self.s1[b] * ctx)

    def decode(self, b: int, ctx: float, k: int) -> float:
        """Time of ``k`` decode steps starting at total context ``ctx`` (each step adds ``b``)."""
        if k <= 0:
            return 0.0
        xk = self.kink[b]
        if ctx + b * (k - 1) <= xk:
            return _lin(self.a0[b], self.s0[b], ctx, b, k)
        if ctx >= xk:
            return _lin(self.a1[b], self.s1[b], ctx, b, k)
        n0 = int((xk - ctx) // b) + 1
        return _lin(self.a0[b], self.s0[b], ctx, b, n0) + _lin(self.a1[b], self.s1[b], ctx + b * n0, b, k - n0)

    def steps_within(self, b: int, ctx: float, tau: float) -> int:
        """Smallest number of decode steps whose total time reaches ``tau`` (0 if tau <= 0)."""
        if tau <= 0.0:
            return 0
        xk = self.kink[b]
        if ctx >= xk:
            return _solve_lin(self.a1[b], self.s1[b], ctx, b, tau)
        n0 = int((xk - ctx) // b) + 1 if math.isfinite(xk) else 1 << 60
        t0 = _lin(self.a0[b], self.s0[b], ctx, b, n0) if n0 < (1 << 60) else math.inf
        if tau <= t0:
            return _solve_lin(self.a0[b], self.s0[b], ctx, b, tau)
        return n0 + _solve_lin(self.a1[b], self.s1[b], ctx + b * n0, b, tau - t0)


def build_timing(
    perf: ReplicaPerf, chunk: int = DEFAULT_CHUNK_TOKENS, max_running: int = DEFAULT_MAX_RUNNING
) -> ReplicaTiming:
    """Tabulate ``perf`` (which must fit) for batches 1..max_running and chunks 0..chunk tokens."""
    if not perf.fits:
        raise ValueError(f"replica does not fit: {perf.reason}")
    kv = int(perf.kv_capacity_tokens)
    n = np.arange(chunk + 1, dtype=float)
    pf_lo = np.asarray(perf.prefill_time(n, n), dtype=float)
    pf_hi = np.asarray(perf.prefill_time(n, n * n), dtype=float)
    b = np.arange(max_running + 1, dtype=float)
    bb = np.maximum(b, 1.0)
    x_max = float(max(kv, 1))
    h = max(1.0, x_max * 1e-4)
    f0 = np.asarray(perf.decode_step_time(bb, 0.0), dtype=float)
    fh = np.asarray(perf.decode_step_time(bb, h), dtype=float)
    fx = np.asarray(perf.decode_step_time(bb, x_max), dtype=float)
    fxh = np.asarray(perf.decode_step_time(bb, x_max - h), dtype=float)
    s0 = (fh - f0) / h
    s1 = (fx - fxh) / h
    a0 = f0
    a1 = fx - s1 * x_max
    with np.errstate(divide="ignore", invalid="ignore"):
        kink = np.where(s1 > s0 * (1 + 1e-9), (a0 - a1) / (s1 - s0), np.inf)
    kink = np.where(np.isfinite(kink), np.maximum(kink, -1.0), np.inf)
    # measure how well max(line0, line1) reproduces the model on a grid of (batch, context)
    probe_b = np.unique(np.linspace(1, max_running, 24).astype(int)).astype(float)
    probe_x = np.linspace(0.0, x_max, 33)
    bi = probe_b.astype(int)[:, None]
    truth = np.asarray(perf.decode_step_time(probe_b[:, None], probe_x[None, :]), dtype=float)
    approx = np.maximum(a0[bi] + s0[bi] * probe_x, a1[bi] + s1[bi] * probe_x)
    err = float(np.max(np.abs(approx - truth) / truth))
    return ReplicaTiming(
        perf=perf,
        kv_capacity=kv,
        max_running=max_running,
        chunk=chunk,
        pf_lo=pf_lo.tolist(),
        pf_hi=pf_hi.tolist(),
        a0=a0.tolist(),
        s0=s0.tolist(),
        a1=a1.tolist(),
        s1=s1.tolist(),
        kink=kink.tolist(),
        max_rel_error=err,
    )
