"""Workload: trace replay scaled to the rate, synthetic arrivals, lengths from profile/trace, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from boute.data import data_path
from boute.specs import load_scenario
from boute.workload import build_workload, workload_stats
from boute.workload.arrivals import read_trace
from boute.workload.profiles import profile_lengths
from boute.workload.tokens import count_tokens


def _with(scenario, arrivals=None, lengths=None, **wl):  # type: ignore[no-untyped-def]
    w = scenario.workload
    upd = dict(wl)
    if arrivals:
        upd["arrivals"] = w.arrivals.model_copy(update=arrivals)
    if lengths:
        upd["lengths"] = w.lengths.model_copy(update=lengths)
    return scenario.model_copy(update={"workload": w.model_copy(update=upd)})


@pytest.fixture(scope="module")
def sc():  # type: ignore[no-untyped-def]
    return load_scenario(None)


def test_trace_replay_scaled_to_rate(sc) -> None:  # type: ignore[no-untyped-def]
    trace = read_trace(data_path("builtin:azure-conv"))
    assert len(trace.offset_s) == 19366
    assert 5.0 < trace.rate_rps < 6.0
    w = build_workload(sc, rate_rps=20, duration_s=3600)
    assert abs(len(w) - 72000) / 72000 < 0.02  # one trace hour = one simulated hour at 20/5.4 the density
    assert w.arrival_s[0] == 0.0 and np.all(np.diff(w.arrival_s) >= 0) and w.arrival_s[-1] < 3600
    gaps = np.diff(w.arrival_s)
    assert 0.9 < gaps.std() / gaps.mean() < 1.4  # the trace's burstiness survives scaling


def test_trace_wraps_around_when_horizon_exceeds_it(sc) -> None:  # type: ignore[no-untyped-def]
    trace = read_trace(data_path("builtin:azure-conv"))
    w = build_workload(sc, rate_rps=trace.rate_rps, duration_s=2 * trace.offset_s[-1])
    assert abs(len(w) - 2 * 19366) <= 3
    # the second pass repeats the first pass's gaps
    g = np.diff(w.arrival_s)
    np.testing.assert_allclose(g[19366 : 19366 + 100], g[:100], rtol=1e-9)


@pytest.mark.parametrize("kind,cv", [("poisson", 1.0), ("gamma", 2.0), ("gamma", 0.5)])
def test_synthetic_arrivals_rate_and_cv(sc, kind: str, cv: float) -> None:  # type: ignore[no-untyped-def]
    w = build_workload(_with(sc, arrivals={"kind": kind, "cv": cv}), rate_rps=50, duration_s=400)
    assert abs(len(w) / 400 - 50) / 50 < 0.05
    g = np.diff(w.arrival_s)
    assert abs(g.std() / g.mean() - cv) / cv < 0.1


def test_profile_lengths_follow_prompts(sc) -> None:  # type: ignore[no-untyped-def]
    w = build_workload(sc, rate_rps=50, duration_s=20)
    models = tuple(t.quality_model for t in sc.tiers)
    prof = profile_lengths("builtin:gsm8k", "auto", models)
    assert len(prof.input_tokens) == 1319 and prof.models == models
    assert w.prompt_index.min() >= 0 and w.prompt_index.max() < 1319
    np.testing.assert_array_equal(w.input_tokens, prof.input_tokens[w.prompt_index])
    np.testing.assert_array_equal(w.output_tokens, prof.output_tokens[w.prompt_index])
    assert 40 < prof.input_tokens.mean() < 80  # GSM8K questions are short
    assert 80 < prof.output_tokens.mean() < 150  # worked answers


def test_a_scenario_mix_draws_prompts_in_it_and_a_bad_mix_names_its_field(sc, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from boute.errors import SpecError
    from boute.quality import quality_model_for
    from boute.specs.scenario import ScoreMix

    scores = quality_model_for(sc).route_all
    edge = float(np.quantile(scores, 0.8))
    mixed = _with(sc, mix=ScoreMix(edges=[edge], shares=[0.0, 1.0]))
    w = build_workload(mixed, duration_s=20.0)
    assert (scores[w.prompt_index] > edge).all()  # only the hardest fifth of the prompts
    assert quality_model_for(mixed).preroute([1.0, 0.0]).quality < quality_model_for(sc).preroute([1.0, 0.0]).quality
    doc = sc.model_dump(mode="json") | {"name": "bad-mix"}
    doc["workload"]["mix"] = {"edges": [0.5, 0.2], "shares": [0.2, 0.3, 0.5]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match=r"bad.yaml.*workload.mix.*ascending"):
        load_scenario(tmp_path / "bad.yaml")


def test_mtbench_profile_has_two_turns_per_question() -> None:
    prof = profile_lengths("builtin:mt-bench", "auto", ("gpt-4-1106-preview",))
    assert len(prof.input_tokens) == 160
    # turn 2 prompts hold the whole first exchange, so they are longer than turn 1's
    assert prof.input_tokens[1::2].mean() > 3 * prof.input_tokens[0::2].mean()


def test_trace_lengths_follow_trace_rows(sc) -> None:  # type: ignore[no-untyped-def]
    s = _with(sc, lengths={"source": "trace", "max_input": 100000, "max_output": 100000})
    w = build_workload(s, rate_rps=10, duration_s=50)
    trace = read_trace(data_path("builtin:azure-conv"))
    np.testing.assert_array_equal(w.input_tokens, trace.context_tokens[: len(w)])
    np.testing.assert_array_equal(w.output_tokens, trace.generated_tokens[: len(w)])
    assert np.all(w.prompt_index == -1)


def test_synthetic_lengths_scale_and_caps(sc) -> None:  # type: ignore[no-untyped-def]
    s = _with(sc, lengths={"source": "lognormal", "input_tokens": 400, "output_tokens": 200, "sigma": 0.5})
    w = build_workload(s, rate_rps=100, duration_s=100)
    assert abs(w.input_tokens.mean() - 400) / 400 < 0.05 and abs(w.output_tokens.mean() - 200) / 200 < 0.05
    s2 = _with(
        sc, lengths={"source": "fixed", "input_tokens": 300, "output_tokens": 50, "scale": 2.0, "max_input": 500}
    )
    w2 = build_workload(s2, rate_rps=10, duration_s=10)
    assert set(w2.input_tokens.tolist()) == {500} and set(w2.output_tokens.tolist()) == {100}


def test_deterministic_for_a_seed(sc) -> None:  # type: ignore[no-untyped-def]
    s = _with(sc, arrivals={"kind": "poisson"})
    a, b, c = (build_workload(s, rate_rps=30, duration_s=30, seed=k) for k in (1, 1, 2))
    for f in ("arrival_s", "input_tokens", "output_tokens", "prompt_index"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert not np.array_equal(a.prompt_index, c.prompt_index)


def test_workload_stats(sc) -> None:  # type: ignore[no-untyped-def]
    w = build_workload(sc, rate_rps=40, duration_s=60)
    st = workload_stats(w)
    # the workload's own rate: the replayed trace window's local rate, not the nominal 40
    assert st.rate_rps == pytest.approx(len(w) / 60) and st.rate_rps != 40 and 30 < st.rate_rps < 50
    poisson = sc.workload.model_copy(update={"arrivals": sc.workload.arrivals.model_copy(update={"kind": "poisson"})})
    wp = build_workload(sc.model_copy(update={"workload": poisson}), rate_rps=40, duration_s=600)
    assert workload_stats(wp).rate_rps == pytest.approx(40, rel=0.05)
    assert st.mean_input == pytest.approx(w.input_tokens.mean())
    assert st.output_sq_mean >= st.mean_output**2
    assert st.p95_output >= st.mean_output


def test_token_counts_and_disk_cache(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from boute.workload.tokens import cached_counts

    assert count_tokens(["hello world", ""]).tolist() == [2, 0]
    monkeypatch.setenv("BOUTE_CACHE_DIR", str(tmp_path))
    first = cached_counts(["unit-test"], {"a": ["one two three"]})
    assert first["a"].tolist() == [3]
    assert len(list((tmp_path / "tokens").glob("*.npz"))) == 1
    assert cached_counts(["unit-test"], {"a": ["one two three"]})["a"].tolist() == [3]


def test_each_tier_answers_at_its_own_models_recorded_length() -> None:
    """MT-Bench records both tier models' answers (Mixtral 285 tokens on average, GPT-4 382): a request's
    length at tier k is its prompt's recorded answer by tier k's model, the mean of both is the single
    ``output_tokens``, and a scale applies to every tier alike."""
    sc = load_scenario("experiments/scenarios/mtbench-f81.yaml")
    models = tuple(t.quality_model for t in sc.tiers)
    per_model = [profile_lengths("builtin:mt-bench", "auto", (m,)).output_tokens for m in models]
    w = build_workload(sc, rate_rps=20, duration_s=60)
    assert w.tier_output_tokens is not None and w.tier_output_tokens.shape == (len(w), 2)
    for k in range(2):
        np.testing.assert_array_equal(w.output_at(k), per_model[k][w.prompt_index])
    assert w.output_at(0).mean() < 0.85 * w.output_at(1).mean()
    np.testing.assert_array_equal(w.output_at(np.ones(len(w), dtype=np.int64)), w.output_at(1))
    np.testing.assert_array_equal(w.output_tokens, np.rint((per_model[0] + per_model[1]) / 2)[w.prompt_index])
    half = build_workload(_with(sc, lengths={"output_scale": 0.5}), rate_rps=20, duration_s=60)
    assert half.tier_output_tokens is not None
    np.testing.assert_array_equal(half.tier_output_tokens, np.maximum(np.rint(w.tier_output_tokens * 0.5), 1))
    # a length model that records no tier's answers leaves one length for every tier
    syn = build_workload(_with(sc, lengths={"source": "fixed"}), rate_rps=20, duration_s=10)
    assert syn.tier_output_tokens is None and syn.output_at(1) is syn.output_tokens


def test_the_replayed_stream_carries_held_out_prompts_only(sc) -> None:  # type: ignore[no-untyped-def]
    """``replay_workload``: the scenario's arrivals with prompts drawn from the given (held-out) rows only;
    the rows of a mix keep their mix weights among themselves."""
    from boute.workload import replay_workload

    rows = np.arange(0, 1319, 7)
    w = replay_workload(sc, rows, rate_rps=50, duration_s=60)
    whole = build_workload(sc, rate_rps=50, duration_s=60)
    np.testing.assert_array_equal(w.arrival_s, whole.arrival_s)
    assert set(w.prompt_index.tolist()) <= set(rows.tolist()) and len(set(w.prompt_index.tolist())) > 100
    assert not set(whole.prompt_index.tolist()) <= set(rows.tolist())
    with pytest.raises(ValueError, match="profile rows"):
        replay_workload(sc, np.asarray([5000]), rate_rps=5, duration_s=10)


def test_verify_replays_held_out_prompts_whatever_the_length_source() -> None:
    """``boute verify``'s requests carry held-out prompts: the replayed stream's own rows where its lengths are
    the profile's, a draw from the held-out rows where they are not (long-prompt: the trace's lengths, so the
    workload's requests carry no profile row)."""
    from boute.quality import quality_model_for
    from boute.quality.build import profile_for
    from boute.serving.replay_requests import build_requests

    for ref in (None, "experiments/scenarios/long-prompt.yaml"):
        s = load_scenario(ref)
        qm = quality_model_for(s)
        req = build_requests(s, profile_for(s), qm.test_index, duration_s=20)
        assert set(req.rows.tolist()) <= set(qm.test_index.tolist()) and len(set(req.rows.tolist())) > 50


def test_a_plans_simulated_figures_belong_to_the_scenario_not_to_the_search_seed() -> None:
    """Long-prompt's requests carry the trace's lengths and no profile prompt, so the simulator draws their
    tiers by the routing fractions; that draw is the scenario's (``workload.seed``): two search seeds give
    one plan the same P95 (the promise), while another ``workload.seed`` is another draw."""
    from boute.optimize.evaluators.sim import SimEvaluator
    from boute.optimize.space import Space

    sc = load_scenario("experiments/scenarios/long-prompt.yaml")
    evs = [SimEvaluator(sc, seed=seed) for seed in (0, 1)]
    assert (np.asarray(evs[0].workload.prompt_index) < 0).all()  # every tier here is a draw
    space = Space.build(sc)
    rng = np.random.default_rng(3)
    plans = [space.decode(rng.random(space.dim)) for _ in range(3)]
    for cand in plans:
        a, b = (ev(cand) for ev in evs)
        assert (a.p95_latency_s, a.p50_latency_s, a.throughput_rps) == (
            b.p95_latency_s,
            b.p50_latency_s,
            b.throughput_rps,
        )
    other = SimEvaluator(_with(sc, seed=sc.workload.seed + 1))
    fr = np.array([0.8, 0.2])
    routes = [ev.quality_model.assign(ev.workload.prompt_index, fr, seed=ev.seed) for ev in (evs[0], other)]
    assert not np.array_equal(*routes)
