"""Local target end to end: emulated replicas as supervised processes, a real gateway following the Redis
registry, a rolling update under load with zero failed requests, a killed replica restarted and
re-registered, and the ``boute deploy`` CLI (deploy / status / down / bad input)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from backends.deploy.controller import Controller
from backends.deploy.gateway import start_gateway
from backends.deploy.launch import LaunchOptions
from backends.deploy.local import LocalTarget
from backends.deploy.registry import Registry
from boute.specs.plan import Plan
from tests.deploy_helpers import PLAN_A, PLAN_B, Load, listening_ips, url_host, wait_for
from tests.waits import SAFETY_S

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)


@pytest.fixture()
def registry(redis_url: str):
    reg = Registry(redis_url, f"test-deploy-{uuid.uuid4().hex[:8]}")
    yield reg
    reg.clear()
    reg.close()


def test_rolling_update_under_load_and_restart(tmp_path: Path, registry: Registry) -> None:
    opts = LaunchOptions(emulate=True, speedup=20)
    ctl = Controller(LocalTarget(tmp_path, opts), registry, opts, tmp_path, propagation_s=0.3)
    gw = None
    try:
        ctl.apply(Plan.model_validate(PLAN_A))
        assert sorted(e["name"] for e in registry.entries()) == sorted(ctl.replicas)
        url, gw = start_gateway(registry.url, registry.prefix, tmp_path)
        assert wait_for(lambda: httpx.get(url + "/ready").status_code == 200)
        before = dict(ctl.replicas)
        with Load(url, clients=3) as load:
            load.more_answers(20, "answers before the update")
            ctl.apply(Plan.model_validate(PLAN_B))
            load.more_answers(20, "answers after it")
        assert load.outcomes["200"] >= 40 and load.failed == 0, load.outcomes
        assert load.tiers["small"] > 0 and load.tiers["large"] > 0
        names = {e["name"] for e in registry.entries()}
        assert names == set(ctl.replicas) and len(names) == 3
        kept = "small.llama-3.1-8b.rtx-4090.tp1pp1.bf16.0"
        assert ctl.replicas[kept].handle is before[kept].handle  # shared replica kept, not restarted
        state = json.loads((tmp_path / "state.json").read_text())
        assert state["generation"] == 2 and state["status"] == "ready"

        # a crash: the supervisor restarts the process, the watch loop deregisters then re-registers it
        entry = ctl.replicas[kept]
        os.kill(entry.handle.info()["pid"], 9)
        events: list[str] = []
        assert wait_for(lambda: bool(events.extend(ctl.check()) or f"re-registered {kept}" in events))
        assert f"deregistered {kept}" in events
        assert entry.handle.info()["restarts"] == 1 and entry.registered
        assert kept in {e["name"] for e in registry.entries()}
    finally:
        if gw is not None:
            gw.stop(5)
        ctl.down()
    assert registry.entries() == []


#: `deploy up --timeout`: the CLI's own bound on the fleet becoming ready (its message beats a kill)
READY_S = 2 * SAFETY_S


def _boute(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The CLI as a process; the bound is the net beyond the CLI's own waits (``--timeout``, ``deploy down``'s)."""
    return subprocess.run(
        [sys.executable, "-m", "boute.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=READY_S + SAFETY_S,
    )


@pytest.mark.timeout(600)  # six CLI processes, one of which waits up to READY_S for the fleet
def test_cli_deploy_status_down(tmp_path: Path, redis_url: str) -> None:
    env = {**os.environ, "BOUTE_REDIS_URL": redis_url}
    d, prefix = tmp_path / "dep", f"test-cli-{uuid.uuid4().hex[:8]}"
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                **PLAN_A,
                "deployment": PLAN_A["deployment"][1:]
                + [{"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090"}],
            }
        )
    )
    bad = tmp_path / "bad.json"
    bad_dep = [{"tier": "small", "model": "llama-3.1-8b", "gpu": "nope"}, PLAN_A["deployment"][1]]
    bad.write_text(json.dumps({**PLAN_A, "deployment": bad_dep}))
    r = _boute("deploy", "up", str(bad), "--emulate", "--dir", str(d), env=env)
    assert r.returncode == 2 and "deployment[0].gpu" in r.stderr and "Traceback" not in r.stderr
    r = _boute("deploy", "up", str(plan), "--target", "moon", "--dir", str(d), env=env)
    assert r.returncode == 2 and "--target" in r.stderr
    try:
        r = _boute(
            "deploy",
            "up",
            str(plan),
            "--emulate",
            "--speedup",
            "20",
            "--dir",
            str(d),
            "--prefix",
            prefix,
            "--timeout",
            str(READY_S),
            "--json",
            env=env,
        )
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["status"] == "ready" and len(st["replicas"]) == 2 and all(x["registered"] for x in st["replicas"])
        reg = Registry(redis_url, prefix)
        assert len(reg.entries()) == 2
        # emulated replicas are registered at, and listen on, loopback only (issue 28)
        assert {url_host(e["url"]) for e in reg.entries()} == {"127.0.0.1"}
        assert listening_ips(*(x["pid"] for x in st["replicas"])) == {"127.0.0.1"}
        r = _boute("deploy", "status", "--dir", str(d), env=env)
        assert r.returncode == 0 and "status ready" in r.stdout and "large.llama-3.1-70b.h100-sxm" in r.stdout
        assert "replicas listen on 127.0.0.1, no token" in r.stdout
    finally:
        r = _boute("deploy", "down", "--dir", str(d), env=env)
    assert r.returncode == 0 and "stopped 2 replicas" in r.stdout
    assert Registry(redis_url, prefix).entries() == []
    r = _boute("deploy", "status", "--dir", str(d), env=env)
    assert "status stopped" in r.stdout
