"""Arrival processes: a real trace replayed at a target rate, or synthetic Poisson / gamma renewals.

Replaying a trace keeps its burstiness (the Azure conversation trace has inter-arrival CV ~1.1 with
minute-scale rate swings) while scaling its *mean* rate: every inter-arrival gap is multiplied by
``trace_rate / rate_rps``. When the horizon needs more requests than the trace holds, the gap sequence
wraps around (the seam gets the trace's mean gap).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from boute.errors import SpecError


@dataclass(frozen=True)
class Trace:
    """An Azure-format trace: arrival offsets (s, from the first request) and the recorded lengths."""

    offset_s: np.ndarray  # float64, sorted, starts at 0
    context_tokens: np.ndarray  # int64
    generated_tokens: np.ndarray  # int64

    @property
    def rate_rps(self) -> float:
        n = len(self.offset_s)
        span = float(self.offset_s[-1])
        return (n - 1) / span if span > 0 else float(n)


def _seconds(stamp: str) -> float:
    """``2023-11-16 18:15:46.6805900`` -> seconds since the epoch day start (7-digit fractions are fine)."""
    day, _, clock = stamp.strip().partition(" ")
    h, m, s = clock.split(":")
    days = np.datetime64(day, "D").astype(np.int64)
    return float(days) * 86400.0 + int(h) * 3600.0 + int(m) * 60.0 + float(s)


@lru_cache(maxsize=4)
def _read_trace(path: Path, mtime_ns: int) -> Trace:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, None, f"cannot read trace: {getattr(exc, 'strerror', None) or exc}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
    if reader.fieldnames is None or not need <= set(reader.fieldnames):
        raise SpecError(path, "header", f"a trace needs columns {sorted(need)}")
    ts, ctx, gen = [], [], []
    for lineno, row in enumerate(reader, 2):
        try:
            ts.append(_seconds(row["TIMESTAMP"]))
            ctx.append(int(row["ContextTokens"]))
            gen.append(int(row["GeneratedTokens"]))
        except (ValueError, AttributeError) as exc:
            raise SpecError(path, f"line {lineno}", f"bad trace row ({exc})") from None
    if len(ts) < 2:
        raise SpecError(path, None, "a trace needs at least 2 requests")
    t = np.asarray(ts)
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order[0]]
    return Trace(t, np.asarray(ctx, dtype=np.int64)[order], np.asarray(gen, dtype=np.int64)[order])


def read_trace(path: Path) -> Trace:
    """Parse (and memoise per process) an Azure LLM inference trace CSV."""
    if not path.is_file():
        raise SpecError(path, None, "trace file not found")
    return _read_trace(path.resolve(), path.stat().st_mtime_ns)


def trace_arrivals(trace: Trace, rate_rps: float, duration_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times in [0, duration) replaying ``trace`` at ``rate_rps``, and the trace row of each."""
    gaps = np.diff(trace.offset_s)
    gaps = np.append(gaps, gaps.mean()) * (trace.rate_rps / rate_rps)  # seam gap, then scale
    cycle = float(gaps.sum())
    reps = int(np.ceil(duration_s / cycle)) + 1
    starts = np.concatenate([[0.0], np.cumsum(np.tile(gaps, reps))[:-1]])
    n = int(np.searchsorted(starts, duration_s, side="left"))
    return starts[:n], np.arange(n, dtype=np.int64) % len(gaps)


def renewal_arrivals(kind: str, rate_rps: float, duration_s: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson (exponential gaps) or gamma renewal arrivals with the given CV, in [0, duration)."""
    mean_gap = 1.0 / rate_rps
    n_guess = int(rate_rps * duration_s * 1.2 + 10 * np.sqrt(rate_rps * duration_s) + 16)
    out: list[np.ndarray] = []
    total, last = 0, 0.0
    while last < duration_s:
        if kind == "poisson":
            gaps = rng.exponential(mean_gap, n_guess)
        else:
            shape = 1.0 / (cv * cv)
            gaps = rng.gamma(shape, mean_gap / shape, n_guess)
        times = last + np.cumsum(gaps)
        if total == 0:
            times = times - gaps[0]  # the first request arrives at t = 0, like a replayed trace
        out.append(times)
        total += len(times)
        last = float(times[-1])
    t = np.concatenate(out)
    return t[t < duration_s]
