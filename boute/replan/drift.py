"""Has the running system left its plan behind? Triggers with stated thresholds and hysteresis.

Conditions, each judged on the rolling window (:mod:`boute.replan.window`) against the plan's promise:

- ``rate_high`` / ``rate_low``: the arrival rate outside the plan's headroom (``rate_up`` above, or
  ``rate_down`` below: paying for capacity nobody uses is drift too) *and* outside the band the plan's own
  arrival process strays within over a window (``Promise.rate_band``): a bursty trace's swings are what
  the plan was judged on, not drift;
- ``prompt_mix`` / ``score_mix``: prompt lengths or router scores shifted from the plan's reference
  prompts (two-sample Kolmogorov-Smirnov: significant *and* large, ``ks_d``, so a big sample does not
  flag a negligible shift); the units are the gateway's own (characters, the plan's router's score);
- ``answer_mix``: answer lengths shifted from the first full window after the plan went live (the
  backends count answer tokens with their own tokenizer, so the baseline is measured, not modelled);
- ``p95_over``: measured P95 above the promise by ``p95_over``;
- ``capacity_lost``: a replica group with fewer healthy replicas than the plan deployed;
- ``shedding``: more than ``max_failed`` of the window's requests shed (429) or failed: the one thing
  the system must not do, whatever the model says.

Hysteresis: a condition fires only after ``sustain`` consecutive checks, and clears only when it is back
inside half its threshold; after a re-plan nothing fires for ``cooldown_s`` except lost capacity, which
cannot wait. Every firing carries its evidence (the numbers it was judged on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from boute.replan.window import Window


@dataclass(frozen=True)
class Thresholds:
    rate_up: float = 0.15  # fire when the rate is 15% above the plan's
    rate_down: float = 0.40  # ... or 40% below it
    ks_d: float = 0.15  # KS statistic (largest CDF gap) that counts as a shift
    ks_p: float = 1e-3
    p95_over: float = 0.30  # measured P95 30% above the promise
    sustain: int = 3  # consecutive checks a condition must hold
    cooldown_s: float = 180.0  # after a re-plan (capacity loss excepted)
    min_requests: int = 300  # a window with fewer requests judges nothing but capacity
    max_failed: float = 0.005  # share of a window's requests shed or failed


@dataclass(frozen=True)
class Promise:
    """What the plan was made for, in the gateway's units."""

    rate_rps: float
    p95_s: float | None
    prompt_chars: np.ndarray  # reference prompts' lengths
    scores: np.ndarray  # the plan's router on the reference prompts
    groups: dict[str, int]  # replica group -> replicas deployed
    rate_band: tuple[float, float] = (1.0, 1.0)  # planned traffic's own window-to-window range, over its mean


@dataclass(frozen=True)
class Trigger:
    kind: str
    at: float
    evidence: dict[str, Any]

    def line(self) -> str:
        ev = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.evidence.items())
        return f"{self.kind}: {ev}"


def ks(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sample KS statistic and p-value (1.0 when either sample is empty)."""
    if len(a) == 0 or len(b) == 0:
        return 0.0, 1.0
    from scipy.stats import ks_2samp

    r = ks_2samp(a, b)
    return float(r.statistic), float(r.pvalue)


@dataclass
class DriftDetector:
    promise: Promise
    thresholds: Thresholds = field(default_factory=Thresholds)
    answer_baseline: np.ndarray | None = None
    _streak: dict[str, int] = field(default_factory=dict)
    _active: set[str] = field(default_factory=set)
    _quiet_until: float = 0.0
    log: list[Trigger] = field(default_factory=list)

    def conditions(self, w: Window) -> dict[str, tuple[bool, bool, dict[str, Any]]]:
        """kind -> (beyond the threshold, beyond half of it, evidence)."""
        t, p = self.thresholds, self.promise
        out: dict[str, tuple[bool, bool, dict[str, Any]]] = {}
        lost = {g: (w.healthy.get(g, 0), n) for g, n in p.groups.items() if w.healthy.get(g, 0) < n}
        out["capacity_lost"] = (
            bool(lost),
            bool(lost),
            {"groups": {g: f"{h}/{n} healthy" for g, (h, n) in lost.items()}},
        )
        if w.requests < t.min_requests:
            return out
        ratio = w.rate_rps / p.rate_rps
        hi, lo = max(1 + t.rate_up, p.rate_band[1]), min(1 - t.rate_down, p.rate_band[0])
        ev = {"observed_rps": w.rate_rps, "planned_rps": p.rate_rps, "ratio": ratio, "fire_above": hi, "fire_below": lo}
        out["rate_high"] = (ratio > hi, ratio > 1 + (hi - 1) / 2, ev)
        out["rate_low"] = (ratio < lo, ratio < 1 - (1 - lo) / 2, ev)
        ev = {"failed": w.failed, "requests": w.requests, "share": w.failed_share}
        out["shedding"] = (w.failed_share > t.max_failed, w.failed_share > t.max_failed / 2, ev)
        baseline = self.answer_baseline if self.answer_baseline is not None else np.zeros(0)
        mixes: tuple[tuple[str, np.ndarray, np.ndarray], ...] = (
            ("prompt_mix", w.prompt_chars, p.prompt_chars),
            ("score_mix", w.scores, p.scores),
            ("answer_mix", w.answer_tokens, baseline),
        )
        for kind, now, ref in mixes:
            d, pv = ks(now, ref)
            mix: dict[str, Any] = {"ks_d": d, "p_value": pv}
            mix["mean_now"] = float(np.mean(now)) if len(now) else None
            mix["mean_ref"] = float(np.mean(ref)) if len(ref) else None
            out[kind] = (d > t.ks_d and pv < t.ks_p, d > t.ks_d / 2, mix)
        if p.p95_s is not None and np.isfinite(w.p95_s):
            over = w.p95_s / p.p95_s - 1.0
            ev = {"p95_s": w.p95_s, "promised_s": p.p95_s, "over": over}
            out["p95_over"] = (over > t.p95_over, over > t.p95_over / 2, ev)
        return out

    @property
    def active(self) -> frozenset[str]:
        """Conditions that fired and have not cleared since (a kept plan leaves them active)."""
        return frozenset(self._active)

    def check(self, w: Window, now: float) -> list[Trigger]:
        """Judge one window; the triggers that fire now (each logged)."""
        if self.answer_baseline is None and w.requests >= self.thresholds.min_requests and len(w.answer_tokens):
            self.answer_baseline = np.asarray(w.answer_tokens)
        fired: list[Trigger] = []
        for kind, (beyond, half, ev) in self.conditions(w).items():
            if beyond or (kind in self._active and half):
                self._streak[kind] = self._streak.get(kind, 0) + 1
            else:
                self._streak[kind] = 0
                self._active.discard(kind)
            if self._streak[kind] >= self.thresholds.sustain and kind not in self._active:
                if now < self._quiet_until and kind != "capacity_lost":
                    continue
                self._active.add(kind)
                fired.append(Trigger(kind, now, ev))
        self.log.extend(fired)
        return fired

    def replanned(self, promise: Promise, now: float) -> None:
        """A new plan went live: judge against its promise, re-measure the answer baseline, stay quiet for
        the cooldown (a rollout's transition is not drift)."""
        self.promise = promise
        self.answer_baseline = None
        self._streak.clear()
        self._active.clear()
        self._quiet_until = now + self.thresholds.cooldown_s

    def acknowledged(self, promise: Promise) -> None:
        """A re-plan kept the running plan: judge against ``promise`` (the load it was found fit for) from now
        on. Nothing went live, so nothing is re-measured and nobody goes quiet: the triggers that fired stay
        active (they fire again only after clearing, so a lasting shift is not re-searched every check),
        while any other condition (distress above all) fires as soon as it holds."""
        self.promise = promise

    def quiet(self, now: float) -> None:
        """Nothing was changed but nothing more can be done now (no plan found, a dry run): no firing for the
        cooldown (lost capacity excepted), baselines kept."""
        self._quiet_until = now + self.thresholds.cooldown_s
