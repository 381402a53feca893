"""Observation windows and the drift detector, without servers."""

from __future__ import annotations

import dataclasses

import numpy as np

from boute.replan.decide import Judged, decide
from boute.replan.drift import DriftDetector, Promise, Thresholds, Trigger
from boute.replan.window import Reservoir, Snapshot, TierStats, Window, merge

RNG = np.random.default_rng(0)
REF_PROMPTS = RNG.lognormal(6.0, 0.5, 2000)
REF_SCORES = RNG.beta(2, 5, 2000)
GROUPS = {"small/rtx-4090/tp1pp1": 4, "large/h100-sxm/tp4pp1": 2}


def _snap(t1: float, rate: float, rng: np.random.Generator, *, answers: float = 200.0, instance: str = "a",
          healthy: dict[str, int] | None = None, span: float = 5.0, p95: float = 3.0) -> Snapshot:  # fmt: skip
    n = int(rate * span)
    k = min(n, 256)
    return Snapshot(
        instance=instance,
        t0=t1 - span,
        t1=t1,
        requests=n,
        prompt_chars=[int(v) for v in rng.lognormal(6.0, 0.5, k)],
        answer_tokens=[int(v) for v in rng.lognormal(np.log(answers), 0.4, k)],
        scores=[float(v) for v in rng.beta(2, 5, k)],
        tiers={"small": TierStats(int(n * 0.8), 0, list(rng.gamma(4, p95 / 8, 64))), "large": TierStats(n - int(n * 0.8), 0, list(rng.gamma(4, p95 / 8, 64)))},
        healthy=dict(GROUPS if healthy is None else healthy),
    )  # fmt: skip


def _detector(**kw: float) -> DriftDetector:
    promise = Promise(rate_rps=100.0, p95_s=3.5, prompt_chars=REF_PROMPTS, scores=REF_SCORES, groups=GROUPS)
    return DriftDetector(promise, Thresholds(**kw))  # type: ignore[arg-type]


def test_reservoir_keeps_a_bounded_uniform_sample() -> None:
    r = Reservoir(k=100, seed=1)
    for v in range(10_000):
        r.add(v)
    assert r.n == 10_000 and len(r.values) == 100
    assert 3_000 < np.mean(r.values) < 7_000  # uniform over the stream, not the first 100


def test_merge_sums_instances_and_forgets_old_intervals() -> None:
    rng = np.random.default_rng(1)
    snaps = [_snap(t, 60, rng, instance=i) for t in (5, 10, 15, 20) for i in ("a", "b")]
    snaps.append(_snap(-100, 1000, rng))  # long gone: outside the window
    w = merge(snaps, now=20, span_s=30)
    assert w.instances == 2 and w.requests == 8 * 300
    assert abs(w.rate_rps - 120) < 1e-6  # two instances at 60 req/s each
    assert w.tier_served["small"] == 8 * 240 and 1.0 < w.p95_s < 10.0
    assert w.healthy == GROUPS and len(w.prompt_chars) > 1000


def test_a_steady_workload_never_fires() -> None:
    det = _detector()
    rng = np.random.default_rng(2)
    snaps: list[Snapshot] = []
    fired = []
    for step in range(1, 121):  # 10 minutes of 5 s intervals, judged on a 30 s window
        snaps.append(_snap(step * 5.0, 100 * rng.normal(1.0, 0.03), rng))
        fired += det.check(merge(snaps, now=step * 5.0, span_s=30), now=step * 5.0)
    assert fired == []


def test_a_rate_step_fires_once_after_the_sustain_and_holds_without_flapping() -> None:
    det = _detector(sustain=3)
    rng = np.random.default_rng(3)
    snaps: list[Snapshot] = []
    fired_at = []
    for step in range(1, 61):
        rate = 100 if step <= 20 else (150 if step <= 40 else 108)  # up, then back near the edge
        snaps.append(_snap(step * 5.0, rate, rng))
        for trig in det.check(merge(snaps, now=step * 5.0, span_s=15), now=step * 5.0):
            fired_at.append((step, trig.kind))
    kinds = [k for _, k in fired_at]
    assert kinds.count("rate_high") == 1, fired_at  # once, not every check while it lasts
    step = next(s for s, k in fired_at if k == "rate_high")
    assert 21 <= step <= 26  # after the sustain, within a few intervals of the step
    ev = next(t for t in det.log if t.kind == "rate_high").evidence
    assert ev["ratio"] > 1.15 and ev["planned_rps"] == 100.0


def test_lost_capacity_fires_even_in_the_cooldown_and_longer_answers_fire_answer_mix() -> None:
    det = _detector(sustain=2, cooldown_s=1000)
    rng = np.random.default_rng(4)
    snaps = [_snap(t * 5.0, 100, rng) for t in range(1, 7)]
    assert det.check(merge(snaps, now=30, span_s=30), now=30) == []  # measures the answer baseline
    det.replanned(det.promise, now=30)  # a fresh plan: quiet for 1000 s
    lost = {"small/rtx-4090/tp1pp1": 0, "large/h100-sxm/tp4pp1": 2}
    fired = []
    for t in range(7, 13):
        snaps.append(_snap(t * 5.0, 100, rng, healthy=lost, answers=400))
        fired += det.check(merge(snaps, now=t * 5.0, span_s=15), now=t * 5.0)
    assert [f.kind for f in fired] == ["capacity_lost"]  # answer_mix waits for the cooldown
    assert fired[0].evidence["groups"] == {"small/rtx-4090/tp1pp1": "0/4 healthy"}
    det2 = _detector(sustain=2)
    snaps2 = [_snap(t * 5.0, 100, rng) for t in range(1, 7)]
    det2.check(merge(snaps2, now=30, span_s=30), now=30)
    kinds = []
    for t in range(7, 15):
        snaps2.append(_snap(t * 5.0, 100, rng, answers=400))
        kinds += [f.kind for f in det2.check(merge(snaps2, now=t * 5.0, span_s=15), now=t * 5.0)]
    assert kinds == ["answer_mix"]


def test_the_plans_own_burstiness_is_not_drift_but_a_step_beyond_it_is() -> None:
    """The built-in scenario's trace swings 0.72-1.37x its mean over 30 s windows: a plan judged on that
    process must not fire on it (a fixed 15% threshold would), while 1.5x the rate still fires."""
    from boute.replan.observed import rate_band
    from boute.specs import load_scenario

    sc = load_scenario("builtin:paper-gsm8k")
    lo, hi = rate_band(sc, 100.0, 30.0)
    assert lo < 0.85 and 1.15 < hi < 1.5, (lo, hi)
    promise = Promise(rate_rps=100.0, p95_s=3.5, prompt_chars=REF_PROMPTS, scores=REF_SCORES, groups=GROUPS,
                      rate_band=(lo, hi))  # fmt: skip
    rng = np.random.default_rng(6)
    swings = DriftDetector(promise, Thresholds(sustain=2))
    stepped = DriftDetector(promise, Thresholds(sustain=2))
    snaps: list[Snapshot] = []
    up: list[Snapshot] = []
    fired, fired_up = [], []
    for step in range(1, 41):
        swing = 1.0 + 0.3 * np.sin(step / 3.0)  # inside the band, outside a fixed 15%
        snaps.append(_snap(step * 5.0, 100 * swing, rng))
        up.append(_snap(step * 5.0, 100 * (1.0 if step <= 10 else 1.6), rng))
        fired += swings.check(merge(snaps, now=step * 5.0, span_s=30), now=step * 5.0)
        fired_up += stepped.check(merge(up, now=step * 5.0, span_s=30), now=step * 5.0)
    assert [f.kind for f in fired] == []
    assert [f.kind for f in fired_up] == ["rate_high"]


def test_shedding_fires_and_a_kept_plan_does_not_refire_what_it_acknowledged() -> None:
    det = _detector(sustain=2)
    rng = np.random.default_rng(7)
    snaps = [_snap(t * 5.0, 100, rng) for t in range(1, 7)]
    det.check(merge(snaps, now=30, span_s=30), now=30)  # the answer baseline
    kinds: list[str] = []
    for t in range(7, 12):
        snaps.append(_snap(t * 5.0, 100, rng, answers=400))
        kinds += [f.kind for f in det.check(merge(snaps, now=t * 5.0, span_s=15), now=t * 5.0)]
    assert kinds == ["answer_mix"]
    det.acknowledged(det.promise)  # kept: the shift is known, nothing went live
    for t in range(12, 24):
        s = _snap(t * 5.0, 100, rng, answers=400)
        if t >= 18:  # now the gateway sheds: distress fires at once, no cooldown to wait for
            s = dataclasses.replace(s, tiers={**s.tiers, "small": TierStats(s.tiers["small"].served, 20, [])})
        snaps.append(s)
        kinds += [f.kind for f in det.check(merge(snaps, now=t * 5.0, span_s=15), now=t * 5.0)]
    assert kinds == ["answer_mix", "shedding"]


def _window(*, failed: int = 0) -> Window:
    w = merge([_snap(100.0 + 5 * i, 100.0, np.random.default_rng(i)) for i in range(6)], 131.0, 60.0)
    return dataclasses.replace(w, tier_failed={"small": failed})


def test_measured_distress_rolls_out_even_when_the_fast_path_says_the_running_plan_copes() -> None:
    copes, better = Judged(3.0, 20.0, True), Judged(2.99, 20.0, True)  # the new plan is not 5% better
    for kind in ("capacity_lost", "rate_high", "p95_over"):
        d = decide([Trigger(kind, 0.0, {})], _window(), "latency", copes, better)
        assert d.roll_out and kind in d.reason
    shedding = decide([Trigger("prompt_mix", 0.0, {})], _window(failed=40), "latency", copes, better)
    assert shedding.roll_out and "shed" in shedding.reason
    # capacity lost: rolls out even if the fast path doubts the new plan (optimize found it feasible)
    assert decide([Trigger("capacity_lost", 0.0, {})], _window(), "latency", None, Judged(4.0, 20.0, False)).roll_out


def test_without_distress_a_rollout_must_buy_something_by_the_plans_own_objective() -> None:
    mix, low = [Trigger("answer_mix", 0.0, {})], [Trigger("rate_low", 0.0, {})]
    running = Judged(3.0, 30.0, True)
    assert not decide(mix, _window(), "latency", running, Judged(2.9, 30.0, True)).roll_out
    assert decide(mix, _window(), "latency", running, Judged(2.5, 30.0, True)).roll_out
    assert decide(mix, _window(), None, Judged(3.6, 30.0, False), Judged(3.4, 30.0, True)).roll_out
    assert not decide(mix, _window(), "latency", Judged(3.6, 30.0, False), Judged(3.8, 30.0, False)).roll_out
    # a rate below the plan's: a cheaper plan is a gain only where cost was what the plan was chosen for
    cheaper = Judged(3.0, 18.0, True)
    assert not decide(low, _window(), "latency", running, cheaper).roll_out
    assert decide(low, _window(), "cost", running, cheaper).roll_out
    assert decide(low, _window(), "pareto:knee", running, cheaper).roll_out
    assert not decide(low, _window(), "pareto:knee", running, Judged(3.5, 18.0, True)).roll_out
