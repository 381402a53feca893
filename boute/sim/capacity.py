"""Steady-state operating point of one replica: the shared core of load balancing and the fast path.

A replica at arrival rate ``lam`` runs ``b`` sequences in decode on average. Prefill has priority and
stalls decode: after any iteration of length d, the next one is a prefill (of everything that arrived
during it) with probability ``1 - exp(-lam d)`` (Poisson arrivals), else a decode step. With prefill
iterations of length ``p`` and decode steps of length ``s`` this two-state chain has a stationary share
of prefills ``pi = c / (1 - a + c)`` (``a = 1 - exp(-lam p)``, ``c = 1 - exp(-lam s)``), so the share of
*time* in prefill is ``phi = pi p / (pi p + (1 - pi) s)`` and a prefill holds ``lam (pi p + (1-pi) s) / pi``
prompts. Decode runs the rest of the time, so by Little's law ``b = lam * E[out] * s(b) / (1 - phi)``,
a fixed point solved by secant steps. (Checked against the event simulation: at 40 req/s on one 70B
replica it predicts phi = 0.54 against a simulated 0.52.)

If no fixed point exists below the KV-limited batch ``B* = min(max_running, KV / E[in + out])``
(requests reserve prompt + output tokens), the batch stays full: admissions are then gated by
completions, prefills batch the replacements, and the residence time is ``B* / lam``. The capacity is
that full-batch cycle's rate (:func:`capacity_rps`). All of this uses mean lengths, so it is an
approximation; the event simulator is the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from boute.sim.timing import ReplicaTiming


@dataclass(frozen=True)
class Lengths:
    """Length moments of the requests a replica serves."""

    mean_in: float
    in_sq: float
    mean_out: float
    out_sq: float

    @classmethod
    def of(cls, input_tokens: np.ndarray, output_tokens: np.ndarray) -> Lengths:
        """The moments of a workload's request lengths (1 token each for an empty workload)."""
        if len(input_tokens) == 0:
            return cls(1.0, 1.0, 1.0, 1.0)
        i, o = np.asarray(input_tokens, dtype=float), np.asarray(output_tokens, dtype=float)
        return cls(float(i.mean()), float((i * i).mean()), float(o.mean()), float((o * o).mean()))

    @cached_property
    def prompt_cv2(self) -> float:
        """Squared coefficient of variation of prompt lengths."""
        return max(self.in_sq / max(self.mean_in * self.mean_in, 1e-9) - 1.0, 0.0)

    @cached_property
    def seq_ctx(self) -> float:
        """Time-averaged context of a decoding sequence: in + (length-biased) half of its output."""
        return self.mean_in + 0.5 * self.out_sq / max(self.mean_out, 1e-9)


@dataclass(frozen=True)
class OperatingPoint:
    lam: float  # arrival rate, req/s
    batch: float  # mean decoding sequences
    step_s: float  # decode step time at that batch
    prefill_share: float  # phi: share of time in prefill iterations
    prefill_s: float  # one prefill iteration (with its batched prompts)
    saturated: bool  # the KV-limited batch (or phi >= 1) is reached


def kv_batch(tm: ReplicaTiming, ln: Lengths) -> int:
    """Concurrent requests whose reserved KV (prompt + output) fits: the saturation batch."""
    return max(1, min(tm.max_running, int(tm.kv_capacity // max(1.0, ln.mean_in + ln.mean_out))))


def _step(tm: ReplicaTiming, b: float, seq_ctx: float) -> float:
    bi = max(1, min(tm.max_running, round(b)))
    return tm.step(bi, b * seq_ctx)


def _prefill(tm: ReplicaTiming, prompts: float, ln: Lengths) -> float:
    """One prefill iteration holding ``prompts`` prompts (split into chunks when they exceed one)."""
    total = prompts * ln.mean_in
    if total <= tm.chunk:
        tokens = max(1, round(total))
        return tm.prefill(tokens, min(float(tokens) ** 2, prompts * ln.in_sq), max(1.0, prompts))
    chunks = total / tm.chunk
    return (
        tm.prefill(tm.chunk, min(float(tm.chunk) ** 2, prompts * ln.in_sq / chunks), max(1.0, prompts / chunks))
        * chunks
    )


def _arrival_during(lam: float, mean_s: float, cv2: float) -> float:
    """P(at least one Poisson arrival during an iteration) for an iteration of random length, mean ``mean_s``
    and squared cv ``cv2`` (gamma-shaped): ``1 - (1 + lam m cv2)^(-1/cv2)``. The chance is concave in the
    length, so at the mean length (``1 - exp(-lam m)``, the cv2 -> 0 limit) it overstates how often a
    prefill follows a prefill where prompts vary in length (Jensen): by 0.035 of the prefill share on
    lognormal prompts (sigma 0.5, ~1.5 per iteration) at a 70% loaded 70B H100 replica."""
    if cv2 <= 1e-9:
        return 1.0 - math.exp(-lam * mean_s)
    return 1.0 - (1.0 + lam * mean_s * cv2) ** (-1.0 / cv2)


#: rounds of the prompts-per-prefill fixed point (warm-started, it converges in a few where it exists)
PREFILL_ROUNDS = 60
#: prompts per prefill beyond which the prefill stage has no fixed point (it cannot keep up)
MAX_PROMPTS = 1e6


def operating_point(tm: ReplicaTiming, lam: float, ln: Lengths, iters: int = 40) -> OperatingPoint:
    """The replica's mean batch, step time and prefill share at arrival rate ``lam`` (see module doc).

    Solves b = g(b) = lam * E[out] * step(b) / (1 - phi(b)) for its smallest root (the batch an empty
    replica grows to), bracketed by a doubling scan and refined by Illinois steps.
    """
    bmax = kv_batch(tm, ln)
    sc = ln.seq_ctx
    if lam <= 0:
        return OperatingPoint(0.0, 0.0, _step(tm, 1, sc), 0.0, _prefill(tm, 1, ln), False)

    held = [1.0]  # prompts per prefill iteration: the last solve's, a warm start for the next

    def g(b: float) -> tuple[float, float, float, float]:
        step = _step(tm, b, sc)
        c = 1.0 - math.exp(-lam * step)
        n = held[0]
        pf = phi = 0.0
        # the prompts a prefill holds and its length depend on each other: iterate to the fixed point (a
        # long prefill gathers more prompts for the next one). Two rounds from n = 1 were far from it where
        # prefill is most of the time: 70B on an H100 TP4 at 2,000/28 tokens, 80% load, gave phi 0.76
        # where the fixed point is 0.85 and the simulated share 0.82
        for _ in range(PREFILL_ROUNDS):
            pf = _prefill(tm, n, ln)
            a = _arrival_during(lam, pf, ln.prompt_cv2 / n)
            pi_p = c / (1.0 - a + c)  # share of iterations that are prefills (module doc)
            mean_it = pi_p * pf + (1.0 - pi_p) * step
            phi = pi_p * pf / mean_it
            new = max(1.0, lam * mean_it / pi_p)
            if abs(new - n) <= 1e-4 * n or new > MAX_PROMPTS:
                n = new
                break
            n = new
        held[0] = min(n, MAX_PROMPTS)
        nb = lam * ln.mean_out * step / (1.0 - phi) if phi < 1.0 else math.inf
        return nb, step, phi, pf

    # the smallest fixed point: the batch grows from empty until g(b) = b. Bracket it on a doubling scan
    # (h = g - b is positive at 0), then Illinois steps. Secant steps from b = 1 overshot past the KV
    # limit where g's slope is near 1, calling a replica batch-full at 169 req/s that was not at 187
    # (Llama-3.2-3B on an RTX PRO 6000 TP2, 46/86 tokens: fixed point ~850 of 2,048)
    lo, h_lo, hi, h_hi = _bracket(g, float(bmax))
    if hi is None or h_hi is None:  # no fixed point below the KV-limited batch: it stays full
        return _full_batch(tm, lam, ln, bmax)
    b = _illinois(g, lo, h_lo, hi, h_hi, iters)
    _, step, phi, pf = g(b)
    return OperatingPoint(lam, b, step, phi, pf, False)


#: the batch map of :func:`operating_point`: b -> (g(b), step time, prefill share, prefill iteration)
BatchMap = Callable[[float], tuple[float, float, float, float]]


def _bracket(g: BatchMap, bmax: float) -> tuple[float, float, float | None, float | None]:
    """(lo, h(lo), hi, h(hi)) with ``h = g(b) - b`` positive at lo and <= 0 at hi, on b = 1/64, 1/32, ...
    up to ``bmax``; hi and h(hi) are None when h stays positive up to ``bmax`` (no fixed point below it)."""
    lo, h_lo = 0.0, math.inf
    b = 1.0 / 64.0
    while True:
        nb, *_ = g(min(b, bmax))
        h = nb - min(b, bmax)
        if h <= 0.0:
            return lo, h_lo, min(b, bmax), h
        lo, h_lo = min(b, bmax), h
        if b >= bmax:
            return lo, h_lo, None, None
        b *= 2.0


def _illinois(g: BatchMap, lo: float, h_lo: float, hi: float, h_hi: float, iters: int) -> float:
    """The root of ``h = g(b) - b`` in the bracket [lo, hi] to a relative 1e-4, by at most ``iters`` Illinois
    steps (regula falsi with the stale end's value halved: bracketed, superlinear; a bisection where the
    secant leaves the bracket or h(lo) is infinite)."""
    side = 0
    b = hi
    for _ in range(iters):
        if hi - lo <= 1e-4 * hi:
            break
        f_lo = min(h_lo, 1e300)
        b = hi - h_hi * (hi - lo) / (h_hi - f_lo) if math.isfinite(h_lo) else 0.5 * (lo + hi)
        if not (lo < b < hi):
            b = 0.5 * (lo + hi)
        nb, *_ = g(b)
        h = nb - b
        if h > 0.0:
            lo, h_lo = b, h
            if side == 1:
                h_hi *= 0.5
            side = 1
        else:
            hi, h_hi = b, h
            if side == -1 and math.isfinite(h_lo):
                h_lo *= 0.5
            side = -1
        if abs(h) <= 1e-4 * max(b, 1e-9):
            break
    return b


def _full_batch(tm: ReplicaTiming, lam: float, ln: Lengths, bmax: int) -> OperatingPoint:
    """Batch-full regime: admissions are gated by completions, so each decode step of the full batch is
    followed by one prefill of the prompts that arrived meanwhile; Little's law pins the residence time
    at bmax / lam. Saturated when arrivals per cycle exceed the completions per step (bmax / E[out])."""
    s_full = _step(tm, bmax, ln.seq_ctx)
    per_step = bmax / ln.mean_out
    pf = _prefill(tm, per_step, ln)
    mu = per_step / (s_full + pf)
    if lam >= mu:
        return OperatingPoint(lam, float(bmax), s_full, pf / (s_full + pf), pf, True)
    tau = bmax / (lam * ln.mean_out)  # time per generated token, prefill stalls included
    n = max(1.0, lam * (s_full + pf))
    pf_n = _prefill(tm, n, ln)
    return OperatingPoint(lam, float(bmax), s_full, max(0.0, 1.0 - s_full / tau), pf_n, False)


def capacity_rps(tm: ReplicaTiming, ln: Lengths) -> float:
    """Largest sustainable arrival rate (req/s) of one replica for these lengths: the batch-full cycle.

    With the batch full, a decode step of ``bmax`` sequences completes ``bmax / E[out]`` of them, and
    their replacements are prefilled in one iteration before the next step. (Checked against the event
    simulation: 77.6 req/s predicted vs 75.5 simulated for Llama-3.1-70B TP4 on H100 with GSM8K lengths.)
    """
    bmax = kv_batch(tm, ln)
    per_step = bmax / ln.mean_out
    return per_step / (_step(tm, bmax, ln.seq_ctx) + _prefill(tm, per_step, ln))


def replica_weights(timings: Sequence[ReplicaTiming], ln: Lengths) -> list[float]:
    """The weight each group's replicas are balanced by: one replica's capacity under these lengths.

    The one rule of load sharing: the simulator places a request on the replica with the least
    ``(outstanding + 1) / weight``, and the gateway does the same with these figures (carried by the
    plan, :mod:`boute.sim.weights`), so mixed-GPU replicas share load as the plan was judged on. The
    floor keeps a replica that can hardly serve these lengths from dividing by zero.
    """
    return [max(capacity_rps(tm, ln), 1e-9) for tm in timings]


@dataclass(frozen=True)
class PrefillQueue:
    """The replica's prefill stage seen as a single server with priority over decode (M/G/1).

    Prompts are prefilled FCFS ahead of decode steps, so a prompt waits for the prefill work queued before
    it (Pollaczek-Khinchine), and a decoding request is preempted by every prefill that arrives while it
    decodes (a low-priority job under preemptive priority). At prefill-heavy shapes (long prompts, short
    answers) these two terms dominate the tail; the operating point's mean prefill share does not show them.
    """

    rho: float  # utilisation of the prefill stage used by the queue formulas
    work_rho: float  # prompt work alone (tokens x per-token cost of a full chunk): long-prompt pressure
    wait_mean: float  # mean wait for the prefill stage (s)
    wait_var: float  # its variance (exponential tail with mass rho at 0 removed)
    stall_var_per_token: float  # variance added to the decode phase per generated token (s^2)
    #: prefill work that arrived during the request's own prefill runs before its first decode step (s)
    decode_start_wait: float = 0.0


#: utilisation of the prefill stage beyond which the queue formulas are capped (the tier is then near
#: saturation anyway and the fast path flags itself as uncertain)
MAX_PREFILL_RHO = 0.97


def prefill_queue(tm: ReplicaTiming, lam: float, ln: Lengths, op: OperatingPoint) -> PrefillQueue:
    """Prefill-stage waiting and decode-stall variance at arrival rate ``lam`` (see :class:`PrefillQueue`).

    The stage's utilisation is the larger of the operating point's share of time in prefill (which counts
    short prompts batched into one iteration) and the prompt work at the per-token cost of a full chunk
    (a lower bound: long prompts are compute-bound, batching saves them little), so the mean service per
    prompt is ``rho / lam``; its second moment follows the prompt lengths' (prefill time is close to
    linear in the tokens). A decode phase of
    n steps of ``step_s`` is stretched by the prefill work that arrives meanwhile: variance
    ``n step lam E[S^2] / (1 - rho)^3``.
    """
    if lam <= 0:
        return PrefillQueue(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    per_token = tm.prefill(tm.chunk, tm.chunk * ln.mean_in, max(1.0, tm.chunk / max(ln.mean_in, 1.0))) / tm.chunk
    work = lam * per_token * ln.mean_in
    rho = min(max(op.prefill_share, work), MAX_PREFILL_RHO)
    s1 = rho / lam
    s2 = s1 * s1 * ln.in_sq / max(ln.mean_in * ln.mean_in, 1e-9)
    wq = lam * s2 / (2.0 * (1.0 - rho))
    wait_var = max(0.0, 2.0 * wq * wq / max(rho, 1e-9) - wq * wq)
    stall = op.step_s * lam * s2 / (1.0 - rho) ** 3
    # a request starts decoding right after its own prefill, during which others' prompts arrived: their
    # prefills (and those arriving meanwhile, a busy period) come first. The time-averaged stall in tau
    # misses this: decode starts are not spread evenly in time, they follow prefills.
    start = rho * max(op.prefill_s, s1) / (1.0 - rho)
    return PrefillQueue(rho, work, wq, wait_var, stall, start)
