"""What a search produced: trials, the Pareto front, the chosen plan, hypervolume.

The chosen plan follows the method: among evaluated plans that meet the quality floor, the P95 cap and the
budget, the one with the lowest P95 (ties: higher quality, then lower cost). When none meets them, the
closest one is reported (smallest relative violation) and the caller says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from boute.optimize.evaluators import EvalResult
from boute.optimize.space import Candidate
from boute.specs.targets import Targets


@dataclass(frozen=True)
class Trial:
    index: int
    x: tuple[float, ...]  # the point the strategy asked for
    z: tuple[float, ...]  # canonical encoding of the decoded candidate (what the GP trains on)
    candidate: Candidate
    result: EvalResult | None  # None when the evaluation failed
    status: str = "complete"
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "complete" and self.result is not None


def _arrays(trials: Sequence[Trial]) -> tuple[list[Trial], np.ndarray, np.ndarray, np.ndarray]:
    ok = [t for t in trials if t.ok]
    q = np.array([t.result.quality for t in ok], dtype=float)  # type: ignore[union-attr]
    p = np.array([t.result.p95_latency_s for t in ok], dtype=float)  # type: ignore[union-attr]
    c = np.array([t.result.cost_per_hour for t in ok], dtype=float)  # type: ignore[union-attr]
    return ok, q, p, c


def pareto_mask(quality: np.ndarray, p95: np.ndarray) -> np.ndarray:
    """Non-dominated points for (max quality, min P95); exact duplicates are all kept."""
    q = np.asarray(quality, dtype=float)
    p = np.asarray(p95, dtype=float)
    if q.size == 0:
        return np.zeros(0, dtype=bool)
    better_eq = (q[None, :] >= q[:, None]) & (p[None, :] <= p[:, None])
    strictly = (q[None, :] > q[:, None]) | (p[None, :] < p[:, None])
    return ~np.any(better_eq & strictly, axis=1)


def pareto_front(trials: Sequence[Trial]) -> list[Trial]:
    ok, q, p, _ = _arrays(trials)
    mask = pareto_mask(q, p)
    front = [t for t, m in zip(ok, mask, strict=True) if m]
    return sorted(front, key=lambda t: (t.result.quality, t.result.p95_latency_s))  # type: ignore[union-attr]


def feasible_mask(trials: Sequence[Trial], targets: Targets) -> np.ndarray:
    """Which of the successful trials (in order) meet the targets; sampled qualities within their tolerance."""
    ok = [t.result for t in trials if t.ok and t.result is not None]
    return targets.mask(
        [r.quality for r in ok],
        [r.p95_latency_s for r in ok],
        [r.cost_per_hour for r in ok],
        [r.quality_se for r in ok],
    )


def choose(trials: Sequence[Trial], targets: Targets) -> tuple[Trial | None, Trial | None]:
    """``(chosen, closest)``: the best plan meeting all targets (or None) and, when none does, the closest."""
    ok, q, p, c = _arrays(trials)
    if not ok:
        return None, None
    feas = feasible_mask(ok, targets)
    if feas.any():
        idx = np.flatnonzero(feas)
        best = min(idx, key=lambda i: (p[i], -q[i], c[i], ok[i].index))
        return ok[int(best)], None
    return None, ok[int(np.argmin(targets.violation(q, p, c)))]


def hypervolume(quality: np.ndarray, p95: np.ndarray, targets: Targets) -> float:
    """2-D hypervolume in (quality, -log P95) above the reference point (floor, -log cap).

    Only plans meeting both targets contribute, so the figure rewards exactly what the operator asked for.
    """
    q = np.asarray(quality, dtype=float)
    y = -np.log(np.maximum(np.asarray(p95, dtype=float), 1e-12))
    ref_q, ref_y = targets.quality_floor, -math.log(targets.p95_cap_s)
    keep = (q >= ref_q) & (y >= ref_y)
    if not keep.any():
        return 0.0
    q, y = q[keep], y[keep]
    order = np.argsort(-q)  # sweep from highest quality down, keeping the best latency seen
    hv, best_y = 0.0, ref_y
    qs, ys = q[order], y[order]
    for i in range(len(qs)):
        best_y = max(best_y, ys[i])
        next_q = qs[i + 1] if i + 1 < len(qs) else ref_q
        hv += (qs[i] - next_q) * (best_y - ref_y)
    return float(hv)


def hypervolume_trace(trials: Sequence[Trial], targets: Targets) -> list[float]:
    """Hypervolume after each evaluation (failed trials repeat the previous value)."""
    out: list[float] = []
    for n in range(1, len(trials) + 1):
        _, q, p, c = _arrays(trials[:n])
        within = targets.mask(np.full_like(q, np.inf), np.zeros_like(p), c)  # the budget alone
        out.append(hypervolume(q[within], p[within], targets))
    return out


def best_key_trace(trials: Sequence[Trial], targets: Targets) -> list[str | None]:
    """Key of the chosen plan after each evaluation: convergence = unchanged for ``patience`` steps."""
    out: list[str | None] = []
    best: Trial | None = None
    for t in trials:
        r = t.result
        if t.ok and r is not None and targets.met_by(r.quality, r.p95_latency_s, r.cost_per_hour, r.quality_se):
            b = best.result if best is not None else None
            if b is None or (r.p95_latency_s, -r.quality) < (b.p95_latency_s, -b.quality):
                best = t
        out.append(None if best is None else best.candidate.key())
    return out
