"""The live evaluator: a candidate deployed as emulated replicas, real HTTP through a real gateway, quality
from the recorded answers that came back (bench/bench_live.py compares it with the fast evaluator)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from backends.deploy.live_eval import LiveEvaluator
from boute.optimize.space import Space
from boute.specs import load_scenario

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)


def test_live_evaluation_of_one_candidate(redis_url: str) -> None:
    sc = load_scenario("builtin:small-live")
    space = Space.build(sc)
    cand = space.decode(np.full(space.dim, 0.6))
    from boute.quality.profiles import load_profile
    from boute.sim import plan_cost

    tier_q = load_profile("builtin:gsm8k").mean_quality()
    col = {t.name: t.quality_model for t in sc.tiers}
    with LiveEvaluator(sc, redis_url=redis_url, speedup=10, max_requests=60) as live:
        r = live(cand)
        prefix = live._ctl.registry.prefix
        # a private fleet: replicas on loopback that refuse anyone but the evaluator's own gateway (issue 28)
        urls = [e["url"] for e in live._ctl.registry.entries()]
        assert urls and all(u.startswith("http://127.0.0.1:") for u in urls)
        bare = httpx.post(urls[0] + "/v1/completions", json={"model": "m", "prompt": "p", "max_tokens": 1})
        assert bare.status_code == 401
        assert r.evaluator == "live" and r.extra.failed == 0 and r.extra.requests == 60
        assert r.extra.answers_match_profile == 1.0  # every answer is the answering tier's recorded one
        assert r.extra.answered_shares is not None and set(r.extra.answered_shares) <= {"small", "large"}
        # quality: what the tiers that answered score on average, up to the noise of 60 samples
        expected = sum(share * tier_q[col[t]] for t, share in r.extra.answered_shares.items())
        assert abs(r.quality - expected) < 0.15, (r.quality, expected)
        assert r.p50_latency_s is not None and 0 < r.p50_latency_s <= r.p95_latency_s < 100
        assert r.cost_per_hour == plan_cost(list(cand.deployment), sc)
    from backends.deploy.registry import Registry

    assert Registry(redis_url, prefix).entries() == []  # torn down


@pytest.mark.slow  # two live evaluations, each a fleet of replica processes and a gateway (~15 s)
def test_optimize_cli_with_the_live_evaluator_leaves_nothing_running(redis_url: str, tmp_path, capsys) -> None:
    """`boute optimize --evaluator live`: trials are recorded as live, a plan is written, and the gateway and
    replica processes it started are gone when the command returns (they were once left running)."""
    import json

    import psutil
    import pytest
    import redis

    from boute.cli.main import main as cli_main
    from boute.tracking import open_store

    r = redis.Redis.from_url(redis_url)
    keys_before = set(r.scan_iter("boute-live-*"))
    # what this test process already ran (an earlier test's multiprocessing resource tracker lives as long
    # as the process does): only what the command starts must be gone when it returns
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    db, out = f"sqlite:///{tmp_path / 't.db'}", tmp_path / "plan.json"
    argv = ["optimize", "-s", "builtin:small-live", "--evaluator", "live", "--max-evals", "2", "--quiet"]
    argv += ["--no-confirm", "--redis", redis_url, "--db", db, "--out", str(out), "--p95-cap", "1000"]
    argv += ["--quality-floor", "0"]
    with pytest.raises(SystemExit) as ex:
        cli_main(argv)
    assert ex.value.code in (0, None), capsys.readouterr().err
    assert json.loads(out.read_text())["deployment"]
    store = open_store(db)
    try:
        exp = store.experiments()[0]
        rows = store.trial_rows(exp["id"])
    finally:
        store.close()
    assert exp["evaluator"] == "live" and len(rows) == 2 and {t.evaluator for t in rows} == {"live"}
    leftovers = [
        " ".join(p.cmdline())
        for p in psutil.Process().children(recursive=True)
        if p.pid not in children_before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert leftovers == []
    assert set(r.scan_iter("boute-live-*")) <= keys_before


@pytest.mark.slow  # a search, then up to four live confirmations, each its own fleet (~25 s)
def test_optimize_screens_with_fast_and_confirms_with_live(redis_url: str, tmp_path, capsys) -> None:
    """A run that mixes evaluators: the search uses `fast`, the front is confirmed by live deployments; the
    experiment's trials say which evaluator measured what and the plan carries the live figures."""
    import json

    import pytest

    from boute.cli.main import main as cli_main
    from boute.tracking import open_store

    db, out = f"sqlite:///{tmp_path / 't.db'}", tmp_path / "plan.json"
    argv = ["optimize", "-s", "builtin:small-live", "--evaluator", "fast", "--max-evals", "12", "--quiet"]
    argv += ["--confirm-with", "live"]
    argv += ["--redis", redis_url, "--db", db, "--out", str(out), "--experiment", "mixed"]
    with pytest.raises(SystemExit) as ex:
        cli_main(argv)
    assert ex.value.code in (0, None), capsys.readouterr().err
    assert "confirmations" in capsys.readouterr().out
    store = open_store(db)
    try:
        rows = store.trial_rows(store.experiment("mixed").id)
    finally:
        store.close()
    searched = [r for r in rows if r.status == "complete"]
    confirmed = [r for r in rows if r.status == "confirmed"]
    assert len(searched) == 12 and {r.evaluator for r in searched} == {"fast"}
    assert {r.evaluator for r in rows if r.status == "screened"} <= {"screen"}  # screened: never evaluated
    assert 1 <= len(confirmed) <= 4 and {r.evaluator for r in confirmed} == {"live"}
    assert all(r.metrics["extra"]["failed"] == 0 for r in confirmed)
    assert json.loads(out.read_text())["predicted"]["evaluator"] == "live"
