"""Scalar-fast views of the performance model for the event simulator and the fast path.

The simulator needs millions of step times; calling numpy per step (or per event) would dominate its run
time. Between two events a replica's batch is fixed and every decode step grows each context by one
token, so the time of ``k`` steps is a sum of ``f_B(C + B j)`` for j < k. We tabulate, once per replica
type, each batch size's step time as a function of total context: the perf model's decode step is
smooth and convex in context (a roofline of two lines plus constants), so chords between a few knots
reproduce it, and a k-step sum becomes one arithmetic series per segment it crosses. The linearisation
error is measured on sample points at build time (``max_rel_error``) and tested.

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


#: knots of the piecewise-linear decode-step table over total context (uniform on [0, KV capacity]); the
#: step is smooth and convex in context (a roofline of two lines), so chords between knots bound it from
#: above within ~1e-4 with this many
DECODE_KNOTS = 8


@dataclass
class ReplicaTiming:
    """Tabulated step times of one replica type (lists, for fast scalar indexing)."""

    perf: ReplicaPerf
    kv_capacity: int
    max_running: int
    chunk: int
    pf_lo: list[float]  # prefill_time(n, sum_sq = n): n one-token prompts (one prompt's per-sequence cost)
    pf_hi: list[float]  # prefill_time(n, sum_sq = n^2): one prompt
    seq_cost: float  # per-sequence cost of each further prompt in a pass
    knots: list[float]  # context knots x_0 = 0 < ... < x_m; past x_m the tangent at x_m extrapolates
    a: list[list[float]]  # per batch B, per segment j (m chords, then the tangent): step = a + s * context
    s: list[list[float]]
    max_rel_error: float

    # ---- prefill -------------------------------------------------------------------------------
    def prefill(self, tokens: int, sum_sq: float, prompts: float = 1.0) -> float:
        """One prefill iteration over ``tokens`` (<= chunk) new tokens of ``prompts`` prompts with causal
        term ``sum_sq``."""
        lo, hi = self.pf_lo[tokens], self.pf_hi[tokens]
        extra = self.seq_cost * max(0.0, prompts - 1.0)
        span = float(tokens) * tokens - tokens
        if span <= 0.0:
            return hi + extra
        w = (sum_sq - tokens) / span
        return lo + (hi - lo) * min(1.0, max(0.0, w)) + extra

    # ---- decode --------------------------------------------------------------------------------
    def _segment(self, ctx: float) -> int:
        kn = self.knots
        j = 0
        last = len(kn) - 1
        while j < last and ctx >= kn[j + 1]:
            j += 1
        return j

    def step(self, b: int, ctx: float) -> float:
        """One decode iteration of ``b`` sequences with total context ``ctx``."""
        j = self._segment(ctx)
        return self.a[b][j] + self.s[b][j] * ctx

    def decode(self, b: int, ctx: float, k: int) -> float:
        """Time of ``k`` decode steps starting at total context ``ctx`` (each step adds ``b``)."""
        if k <= 0:
            return 0.0
        kn, ab, sb = self.knots, self.a[b], self.s[b]
        last = len(kn) - 1
        j = self._segment(ctx)
        total = 0.0
        c = ctx
        left = k
        while left > 0:
            if j >= last:
                return total + _lin(ab[j], sb[j], c, b, left)
            n = min(left, int((kn[j + 1] - c) // b) + 1) if c < kn[j + 1] else 0
            if n > 0:
                total += _lin(ab[j], sb[j], c, b, n)
                c += b * n
                left -= n
            j += 1
        return total

    def steps_within(self, b: int, ctx: float, tau: float) -> int:
        """Smallest number of decode steps whose total time reaches ``tau`` (0 if tau <= 0)."""
        if tau <= 0.0:
            return 0
        kn, ab, sb = self.knots, self.a[b], self.s[b]
        last = len(kn) - 1
        j = self._segment(ctx)
        done = 0
        c = ctx
        while True:
            if j >= last:
                return done + _solve_lin(ab[j], sb[j], c, b, tau)
            n = int((kn[j + 1] - c) // b) + 1 if c < kn[j + 1] else 0
            if n > 0:
                t = _lin(ab[j], sb[j], c, b, n)
                if tau <= t:
                    return done + _solve_lin(ab[j], sb[j], c, b, tau)
                tau -= t
                done += n
                c += b * n
            j += 1


def build_timing(
    perf: ReplicaPerf, chunk: int = DEFAULT_CHUNK_TOKENS, max_running: int = DEFAULT_MAX_RUNNING
) -> ReplicaTiming:
    """Tabulate ``perf`` (which must fit) for batches 1..max_running and chunks 0..chunk tokens."""
    if not perf.fits:
        raise ValueError(f"replica does not fit: {perf.reason}")
    kv = int(perf.kv_capacity_tokens)
    n = np.arange(chunk + 1, dtype=float)
    # tabulated for one prompt's per-sequence cost; prefill() adds the others' (linear in the count)
    pf_lo = np.asarray(perf.prefill_time(n, n, prompts=1.0), dtype=float)
    pf_hi = np.asarray(perf.prefill_time(n, n * n, prompts=1.0), dtype=float)
    b = np.arange(max_running + 1, dtype=float)
    bb = np.maximum(b, 1.0)[:, None]
    x_max = float(max(kv, 1))
    # uniform knots up to the KV capacity, then a few doublings for callers that probe past it
    knots = np.concatenate(
        [np.linspace(0.0, x_max, DECODE_KNOTS + 1), x_max * np.array([1.5, 2.0, 3.0, 4.0, 6.0, 8.0])]
    )
    f = np.asarray(perf.decode_step_time(bb, knots[None, :]), dtype=float)  # (batch, knot)
    slope = np.diff(f, axis=1) / np.diff(knots)[None, :]
    inter = f[:, :-1] - slope * knots[None, :-1]
    # past the last knot (never reached in simulation): the tangent there
    h = max(1.0, x_max * 1e-4)
    x_end = float(knots[-1])
    tan = (f[:, -1] - np.asarray(perf.decode_step_time(bb[:, 0], x_end - h), dtype=float)) / h
    slope = np.concatenate([slope, tan[:, None]], axis=1)
    inter = np.concatenate([inter, (f[:, -1] - tan * x_end)[:, None]], axis=1)
    # measure how well the chords reproduce the model on a grid of (batch, context)
    probe_b = np.unique(np.linspace(1, max_running, 24).astype(int))
    probe_x = np.linspace(0.0, x_max, 97)
    truth = np.asarray(perf.decode_step_time(probe_b[:, None].astype(float), probe_x[None, :]), dtype=float)
    seg = np.clip(np.searchsorted(knots, probe_x, side="right") - 1, 0, len(knots) - 2)
    approx = inter[probe_b][:, seg] + slope[probe_b][:, seg] * probe_x[None, :]
    err = float(np.max(np.abs(approx - truth) / truth))
    return ReplicaTiming(
        perf=perf,
        kv_capacity=kv,
        max_running=max_running,
        chunk=chunk,
        pf_lo=pf_lo.tolist(),
        pf_hi=pf_hi.tolist(),
        seq_cost=float(perf.rates.seq_overhead_s),
        knots=knots.tolist(),
        a=inter.tolist(),
        s=slope.tolist(),
        max_rel_error=err,
    )
