"""The multi-model router (issue 31 item 3) trained on real profiles (RouterBench, GSM8K) with knobs that stay
load shares per tier, and multi plans served by the gateway. The price and routing arithmetic on synthetic
predictions is in tests/test_quality_multi_prices.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from boute.quality.multi import prices_for_shares, route

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "routerbench" / "arc_challenge_train.csv"


@pytest.mark.skipif(not DATA.is_file(), reason="../shared/data/routerbench/ not present")
def test_trained_on_routerbench_routes_by_shares() -> None:
    from boute.quality.build import profile_for, tier_models
    from boute.quality.multi import train_multi_router
    from boute.quality.router import split_indices
    from boute.quality.static_embed import load_static
    from boute.specs.scenario import load_scenario

    sc = load_scenario("builtin:routerbench-4tier")
    profile = profile_for(sc)
    models = tier_models(sc, profile)
    train, test = split_indices(len(profile), 0.3, 0)
    mr = train_multi_router(profile, models, train, load_static())
    p = mr.predict(profile.prompts)
    assert p.shape == (len(profile), 4) and ((p > 0) & (p < 1)).all()
    # predicted correctness tracks the tiers' accuracy on the training rows (Yi-34B highest, Mistral-7B lowest)
    acc = profile.scores[np.ix_(train, [profile.models.index(m) for m in models])].mean(axis=0)
    assert np.argmax(p.mean(axis=0)) == np.argmax(acc) and np.argmin(p.mean(axis=0)) == np.argmin(acc)
    f = [0.2, 0.3, 0.5, 0.0]
    tier = route(p, prices_for_shares(p, f))
    np.testing.assert_allclose(np.bincount(tier, minlength=4) / len(p), f, atol=0.002)
    np.testing.assert_allclose(mr.predict(profile.prompts[:3]), p[:3], atol=1e-9)  # one prompt alone = in a batch


@pytest.mark.skipif(not DATA.is_file(), reason="../shared/data/routerbench/ not present")
def test_the_ladder_routers_head_is_the_multi_routers_own_fit() -> None:
    """build_quality_model hands the multi router the ladder router's level head instead of fitting it again:
    that is only sound while the two fits are the same one (features, levels, rows, cross-validation)."""
    from boute.quality.build import profile_for, tier_models
    from boute.quality.multi import train_multi_router
    from boute.quality.router import train_router
    from boute.quality.static_embed import load_static
    from boute.specs.scenario import load_scenario

    sc = load_scenario("builtin:routerbench-4tier")
    profile = profile_for(sc)
    models = tier_models(sc, profile)
    static = load_static()
    ladder, train, _ = train_router(profile, models, seed=3, static=static)
    own = train_multi_router(profile, models, train, static, seed=3)
    given = train_multi_router(profile, models, train, static, seed=3, level_head=(ladder.head, ladder.metadata["C"]))
    np.testing.assert_allclose(given.coef, own.coef, atol=1e-10)
    np.testing.assert_allclose(given.calib, own.calib, atol=1e-10)
    assert given.metadata["C"] == own.metadata["C"]


@pytest.mark.skipif(not DATA.is_file(), reason="../shared/data/routerbench/ not present")
def test_a_format_1_router_still_loads_and_predicts(tmp_path: Path) -> None:
    """Plans written before the item-response model bundle one independent head per tier: they still load."""
    import json

    from boute.quality.build import profile_for, tier_models
    from boute.quality.multi import MultiRouter, load_multi_router
    from boute.quality.static_embed import load_static
    from boute.specs.scenario import load_scenario

    sc = load_scenario("builtin:routerbench-3tier")
    profile = profile_for(sc)
    models = tier_models(sc, profile)
    static = load_static()
    rng = np.random.default_rng(0)
    dim = static.dim + 7
    old = MultiRouter(tuple(models), rng.normal(size=(3, dim)) * 0.01, np.zeros(3), np.zeros(7), np.ones(7), static)
    saved = old.save(tmp_path / "old.npz")
    assert json.loads((tmp_path / "old.npz.json").read_text())["format"] == "boute-multi-router/1"
    back = load_multi_router(saved.path)
    np.testing.assert_allclose(back.predict(profile.prompts[:5]), old.predict(profile.prompts[:5]))
    assert back.calib is None and back.predict(profile.prompts[:5]).shape == (5, 3)


# ------------------------------------------------------------------------------ in plans, the optimiser, the gateway
@pytest.fixture(scope="module")
def gsm8k_multi():
    """The paper scenario's quality model pre-routed by the multi router (trained once, cached on disk)."""
    from boute.quality import quality_model_for
    from boute.specs.scenario import load_scenario, with_router_kind

    sc = with_router_kind(load_scenario("builtin:paper-gsm8k"), "multi")
    return sc, quality_model_for(sc)


def test_the_gateway_scores_a_multi_plan_by_difficulty_and_the_replan_loop_follows_it(gsm8k_multi) -> None:
    """The item-response router's difficulty is the ladder's score (the same level head on the same rows), so
    the gateway records it for the re-plan loop; its tier map gives the tier the optimiser routed by; and a
    running multi plan under a harder mix is judged by the shares its prices give under that mix."""
    from boute.quality.build import profile_for
    from boute.quality.multi import load_multi_router, route
    from boute.quality.router_kinds import PricedScorer
    from boute.replan.observed import running_fractions
    from boute.specs import Plan
    from boute.specs.scenario import ScoreMix

    sc, qm = gsm8k_multi
    router = load_multi_router(qm.info["router_path"])
    prompts = list(profile_for(sc).prompts)
    np.testing.assert_allclose(router.score(prompts), qm.route_all, atol=1e-9)
    f = [0.7, 0.3]
    prices = [float(v) for v in qm.preroute(f).prices]
    scorer = PricedScorer(router, prices)
    assert scorer.difficulty
    scores = scorer.score(prompts[:60])
    assert ((scores >= 0) & (scores <= 1)).all()
    np.testing.assert_array_equal([scorer.tier_of(x) for x in scores], route(router.predict(prompts[:60]), prices))
    plan = Plan.model_validate(
        {
            "routing": {"tiers": ["small", "large"], "fractions": f, "prices": prices, "scorer": "multi"}
            | {"router": "r", "reference": sc.quality.profile},
            "deployment": [
                {"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 1},
                {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4},
            ],
        }
    )
    assert running_fractions(plan, sc) == tuple(f)  # the plan's own traffic: as written
    edges = [float(e) for e in np.quantile(qm.route_all, [0.5])]
    hard = sc.model_copy(
        update={"workload": sc.workload.model_copy(update={"mix": ScoreMix(edges=edges, shares=[0.0, 1.0])})}
    )
    assert running_fractions(plan, hard)[1] > 0.3 + 0.1  # harder traffic: more of it priced onto the large tier


@pytest.mark.parametrize("fractions", [[0.7, 0.3], [0.25, 0.75], [1.0, 0.0]])
def test_the_quality_model_with_multi_splits_the_calibration_prompts_by_the_fractions(gsm8k_multi, fractions) -> None:
    from boute.quality.build import profile_for
    from boute.quality.multi import load_multi_router, route

    _, qm = gsm8k_multi
    assert qm.router_kind == "multi"
    everyone = np.arange(len(qm.route_all))
    tier = qm.assign(everyone, fractions)
    np.testing.assert_allclose(np.bincount(tier, minlength=2) / len(everyone), fractions, atol=1.5 / len(everyone))
    r = qm.preroute(fractions)
    assert r.prices is not None and len(r.prices) == 2 and r.thresholds.size == 0
    # the held-out figures are the answering tiers' scores where the router sends each held-out prompt
    held = qm.assign(qm.test_index, fractions)
    assert r.mean == pytest.approx(float(qm.test_scores[np.arange(qm.n_test), held].mean()), abs=1e-12)
    np.testing.assert_allclose(r.shares, np.bincount(held, minlength=2) / qm.n_test)
    # the same rule as the saved router's own prediction under the prices
    mr = load_multi_router(qm.info["router_path"])
    prompts = profile_for(gsm8k_multi[0]).prompts
    np.testing.assert_array_equal(route(mr.predict(prompts), r.prices), tier)


def _multi_plan(sc, qm, fractions, out: Path):
    from boute.optimize.evaluators.base import router_files_of
    from boute.serving.bundle import write_plan
    from boute.specs import Plan

    plan = Plan.model_validate(
        {
            "routing": {
                "tiers": ["small", "large"],
                "fractions": fractions,
                "prices": [float(v) for v in qm.preroute(fractions).prices],
                "scorer": "multi",
                "router": qm.info["router_path"],
                "reference": sc.quality.profile,
            },
            "deployment": [
                {"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 1},
                {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4},
            ],
        }
    )
    return write_plan(plan, out, sc, router_files_of(qm))


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_multi_plan_round_trips_with_infinite_prices_and_is_refused_when_damaged(
    gsm8k_multi, tmp_path: Path, suffix: str
) -> None:
    import json

    from boute.errors import SpecError
    from boute.quality.router_kinds import PricedScorer
    from boute.serving.bundle import open_plan
    from boute.specs.plan import Routing
    from router.routing import load_scorer

    sc, qm = gsm8k_multi
    out = _multi_plan(sc, qm, [1.0, 0.0], tmp_path / f"plan{suffix}")
    plan = open_plan(out)
    r = plan.routing
    assert r.scorer == "multi" and r.thresholds is None and r.prices == [0.0, math.inf]  # +inf read back as a float
    assert r.router is not None and r.router.startswith("plan.bundle/router-")
    # the table is named by its content (shared by the models saved in one folder), as the metadata says
    table_path = f"{r.router.rsplit('/', 1)[0]}/{json.loads((out.parent / (r.router + '.json')).read_text())['files']['table']['name']}"
    assert {a.path for a in plan.artifacts} >= {r.router, r.router + ".json", table_path}
    if suffix == ".json":
        assert '"Infinity"' not in out.read_text() and "Infinity" in out.read_text()
    scorer = load_scorer(r, out.parent, out)
    assert isinstance(scorer, PricedScorer) and scorer.prices.tolist() == [0.0, math.inf]
    # rules the schema holds
    with pytest.raises(ValueError, match="routes by routing.prices, not thresholds"):
        Routing.model_validate({**r.model_dump(), "thresholds": [0.5]})
    with pytest.raises(ValueError, match="scorer 'multi' only"):
        Routing.model_validate({**r.model_dump(), "scorer": "learned"})
    with pytest.raises(ValueError, match="prices needs 2 values"):
        Routing.model_validate({**r.model_dump(), "prices": [0.0]})
    # damaged: the plan's artifact check refuses it, and so does the router's own hash check, each in one line
    meta = out.parent / (r.router + ".json")
    doc = json.loads(meta.read_text())
    table = out.parent / table_path
    table.write_bytes(table.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(SpecError, match=r"artifacts\[\d+\]\.sha256: .*does not match") as e:
        open_plan(out)
    assert str(out) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SpecError, match=r"routing\.router: .*files\.table\.sha256: hash mismatch") as e:
        load_scorer(r, out.parent, out)
    assert str(out) in str(e.value) and "\n" not in str(e.value)
    meta.write_text(json.dumps({**doc, "format": "boute-router/2"}))  # not a multi router at all
    with pytest.raises(SpecError, match=r"routing\.router: .*format: expected 'boute-multi-router/2'"):
        load_scorer(r, out.parent, out)


@pytest.mark.timeout(120)  # starts replicas and a gateway
def test_the_gateway_routes_each_prompt_to_the_tier_the_multi_router_picks(gsm8k_multi, tmp_path: Path) -> None:
    import json
    import shutil

    import openai

    from boute.quality.build import profile_for
    from boute.quality.multi import load_multi_router, route
    from boute.serving.bundle import bundle_dir, open_plan
    from boute.serving.reason import HEADER, fmt, parse_reason
    from tests.stack import Stack

    sc, qm = gsm8k_multi
    out = _multi_plan(sc, qm, [0.5, 0.5], tmp_path / "plan.json")
    plan = open_plan(out)
    mr, prices = load_multi_router(out.parent / plan.routing.router), np.asarray(plan.routing.prices)
    prompts = profile_for(sc).prompts[:40]
    want = route(mr.predict(prompts), prices)
    assert 0 < want.sum() < len(want)  # both tiers are picked among these prompts
    st = Stack.start(json.loads(out.read_text()), speedup=50)
    try:
        shutil.copytree(bundle_dir(out), bundle_dir(st.plan_file))
        url, _ = st.gateway()
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=60)
        got = []
        for p in prompts:
            raw = client.chat.completions.with_raw_response.create(
                model="boute", messages=[{"role": "user", "content": p}], max_tokens=2
            )
            got.append(raw.headers["x-boute-tier"])
            # the route's reason: the router's difficulty and the prices it was compared with (issue 52)
            why = parse_reason(raw.headers[HEADER])
            assert (why.by, why.tier, why.prices) == ("prices", got[-1], tuple(float(fmt(v)) for v in prices))
            assert why.score == float(fmt(mr.score([p])[0]))
        assert got == [plan.routing.tiers[k] for k in want]
    finally:
        st.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)  # an optimisation and a verify run (20 s of traffic) as processes
@pytest.mark.skipif(not DATA.is_file(), reason="../shared/data/routerbench/ not present")
def test_optimise_with_the_multi_router_then_verify_on_routerbench(tmp_path: Path) -> None:
    """`boute optimize --router multi` writes a plan priced for the multi router (its file bundled), and
    `boute verify` serves it and measures the shares and quality it promised (a short run at a reduced rate:
    the full-rate figures are in docs/quality.md)."""
    import json
    import subprocess
    import sys

    from boute.serving.bundle import open_plan

    def boute(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "boute", *argv], cwd=tmp_path, capture_output=True, text=True, check=False
        )

    r = boute(
        "optimize", "--scenario", "builtin:routerbench-3tier", "--router", "multi", "--strategy", "random",
        "--max-evals", "6", "--max-confirm", "1", "--out", "plan.json", "-q", "--db", f"sqlite:///{tmp_path / 'b.db'}",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    plan = open_plan(tmp_path / "plan.json")
    rt = plan.routing
    assert rt.scorer == "multi" and rt.thresholds is None and rt.prices is not None and len(rt.prices) == 3
    assert rt.router is not None and rt.router.startswith("plan.bundle/router-")
    assert plan.scenario_spec["quality"]["router_kind"] == "multi"
    r = boute("verify", "--plan", "plan.json", "--duration", "20", "--rate", "40", "--json")
    assert r.returncode in (0, 1), r.stderr  # 1 may be the P95, promised at the scenario's full rate
    out = json.loads(r.stdout)
    checks = {c["name"]: c for c in out["checks"]}
    assert out["measured"]["failed"] == 0 and out["measured"]["requests"] > 500
    for t in rt.tiers:
        assert checks[f"share {t}"]["ok"], checks[f"share {t}"]
    assert checks["quality"]["ok"], checks["quality"]


def test_one_rule_maps_fractions_to_prices_for_the_optimiser_and_the_gateway(gsm8k_multi, tmp_path: Path) -> None:
    """A multi plan written without prices is priced by the gateway with the rule the optimiser used
    (prices_for_shares on the reference prompts): every reference prompt goes to the tier the optimiser's
    prices send it to (the prices themselves are one point of the set that gives that assignment: the
    optimiser descends from a nearby policy's); a search result keeps its prices through the tracking DB."""
    from boute.optimize.evaluators.base import EvalResult
    from boute.quality.multi import load_multi_router, route
    from boute.quality.router_kinds import reference_prompts
    from boute.serving.bundle import open_plan
    from boute.specs.plan import Routing
    from router.routing import load_scorer

    sc, qm = gsm8k_multi
    qm.preroute([0.3, 0.7])  # the optimiser's prices for f below then descend from these
    f = [0.6, 0.4]
    out = _multi_plan(sc, qm, f, tmp_path / "plan.json")
    r = open_plan(out).routing
    bare = Routing.model_validate({**r.model_dump(), "prices": None})
    gateway = np.asarray(load_scorer(bare, out.parent, out).prices)
    mine = np.asarray(qm.preroute(f).prices)
    p_ref = load_multi_router(qm.info["router_path"]).predict(list(reference_prompts(r.reference, out.parent)))
    np.testing.assert_array_equal(route(p_ref, gateway), route(p_ref, mine))
    np.testing.assert_allclose(gateway, mine, atol=0.05)  # and near one another
    res = EvalResult(0.8, 1.0, 10.0, 5.0, True, 0.1, "sim", prices=(0.0, math.inf))
    assert EvalResult.from_dict(res.to_dict()).prices == (0.0, math.inf)
    assert "prices" not in EvalResult(0.8, 1.0, 10.0, 5.0, True, 0.1, "sim").to_dict()  # rows read as before
