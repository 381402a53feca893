"""Ray target: a local two-node Ray cluster whose custom resources stand in for GPU types; replicas are
actors that must land on the node offering their GPU type, serve through the gateway, survive a rolling
update under load with zero failed requests, and come back (re-registered) after their process is killed.
Emulated fleets stay on loopback (issue 28): the replicas, and Ray itself, listen on 127.0.0.1 only, and
``boute deploy up --target ray --emulate`` with BOUTE_REPLICA_TOKEN gives replicas that refuse bare requests."""

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
from backends.deploy.desired import ReplicaKey
from backends.deploy.gateway import start_gateway
from backends.deploy.launch import LOOPBACK, LaunchOptions
from backends.deploy.ray_target import RayTarget, placement
from backends.deploy.registry import Registry
from boute.serving.auth import TOKEN_ENV
from boute.specs.plan import Plan
from tests.deploy_helpers import PLAN_A, PLAN_B, Load, listening_ips, url_host, wait_for

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)

HEAD = {"gpu_h100-sxm": 8, "gpu_rtx-pro-6000": 4}
WORKER = {"gpu_rtx-4090": 8, "gpu_rtx-5090": 4}


def test_placement_options() -> None:
    k = ReplicaKey("large", "llama-3.1-70b", "h100-sxm", tp=4)
    opts, bundles = placement(k, "custom")
    assert opts["resources"] == {"gpu_h100-sxm": 4} and bundles == [{"gpu_h100-sxm": 4}]
    opts, bundles = placement(k, "accelerator")
    assert opts["num_gpus"] == 4 and opts["accelerator_type"] == "H100" and bundles[0]["GPU"] == 4
    assert placement(ReplicaKey("s", "m", "rtx-4090"), "custom")[1] is None  # one GPU: no placement group


@pytest.mark.slow  # `boute deploy up --target ray`: its controller starts a Ray node (~15 s), then two replicas
@pytest.mark.timeout(240)  # the deploy waits up to its --timeout 150 for them, then `deploy down` runs
def test_cli_ray_emulated_fleet_is_on_loopback_and_requires_the_token(tmp_path: Path, redis_url: str) -> None:
    """The issue's case: replicas were registered at the machine's external address. Here every registered
    URL, every replica socket and every socket of the Ray node the controller started is on 127.0.0.1; with
    BOUTE_REPLICA_TOKEN a bare request to a replica is refused (401) while the deployment's gateway, which
    inherits the token, answers."""
    from tests.services import free_port

    plan = tmp_path / "plan.json"
    dep = [{"tier": "small", "model": "llama-3.1-8b", "gpu": "rtx-4090"}, PLAN_A["deployment"][1]]
    plan.write_text(json.dumps({**PLAN_A, "deployment": dep}))
    d, prefix, secret = tmp_path / "dep", f"test-ray-cli-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    env = {**os.environ, "BOUTE_REDIS_URL": redis_url, TOKEN_ENV: secret}
    boute = [sys.executable, "-m", "boute.cli.main"]
    up = [*boute, "deploy", "up", str(plan), "--target", "ray", "--emulate", "--speedup", "20", "--dir", str(d)]
    up += ["--prefix", prefix, "--gateway-port", str(free_port()), "--json", "--timeout", "150"]
    try:
        r = subprocess.run(up, capture_output=True, text=True, env=env, timeout=200)
        assert r.returncode == 0, r.stderr[-2000:]
        st = json.loads(r.stdout)
        registered = [e["url"] for e in Registry(redis_url, prefix).entries()]
        assert len(registered) == 2 and {url_host(u) for u in registered} == {LOOPBACK}, registered
        assert {x["node_ip"] for x in st["replicas"]} == {LOOPBACK}
        assert listening_ips(*(x["pid"] for x in st["replicas"])) == {LOOPBACK}
        assert listening_ips(st["pid"], tree=True) == {LOOPBACK}  # the controller, its Ray node, the gateway
        assert st["replica_host"] == LOOPBACK and st["token"] is True and "warning" not in r.stderr
        body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        assert httpx.post(registered[0] + "/v1/chat/completions", json=body, timeout=30).status_code == 401
        gw = httpx.post(st["gateway_url"] + "/v1/chat/completions", json={**body, "model": "boute"}, timeout=60)
        assert gw.status_code == 200, gw.text
    finally:
        down = subprocess.run([*boute, "deploy", "down", "--dir", str(d)], capture_output=True, text=True, env=env)
    assert down.returncode == 0 and "stopped 2 replicas" in down.stdout, down.stderr


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from backends.deploy.ray_local import LOOPBACK_ENV, check_loopback, confine_to_loopback

    saved = {k: os.environ.get(k) for k in LOOPBACK_ENV}
    confine_to_loopback()  # both nodes, and every Ray process, on 127.0.0.1 (backends/deploy/ray_local.py)
    head = {"num_cpus": 1, "resources": HEAD, "include_dashboard": False, "node_ip_address": LOOPBACK}
    c = Cluster(initialize_head=True, head_node_args=head)
    c.add_node(num_cpus=1, resources=WORKER, node_ip_address=LOOPBACK)
    ray.init(address=c.address, namespace="boute-test", log_to_driver=False, _node_ip_address=LOOPBACK)
    check_loopback()
    yield c
    ray.shutdown()
    c.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.mark.slow  # a two-node Ray cluster starts (~15 s) and a rolling update runs on it (~25 s in all)
def test_ray_fleet(cluster, tmp_path: Path, redis_url: str) -> None:
    import ray

    node_res = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    reg = Registry(redis_url, f"test-ray-{uuid.uuid4().hex[:8]}")
    opts = LaunchOptions(emulate=True, speedup=20)
    ctl = Controller(RayTarget(tmp_path, opts), reg, opts, tmp_path, propagation_s=0.3)
    gw = None
    try:
        ctl.apply(Plan.model_validate(PLAN_A))
        for e in ctl.replicas.values():  # each actor sits on a node offering its GPU type, holding tp*pp of it
            info = e.handle.info()
            res = f"gpu_{e.key.gpu}"
            assert info["resources"] == {res: float(e.key.gpus)}
            assert res in node_res[info["node"]]
            assert listening_ips(info["pid"]) == {LOOPBACK}  # an emulated replica listens on loopback only
        assert {url_host(x["url"]) for x in reg.entries()} == {LOOPBACK}
        url, gw = start_gateway(reg.url, reg.prefix, tmp_path)
        assert wait_for(lambda: httpx.get(url + "/ready").status_code == 200)
        with Load(url, clients=3) as load:
            load.more_answers(20, "answers before the update")
            ctl.apply(Plan.model_validate(PLAN_B))
            load.more_answers(20, "answers after it")
        assert load.outcomes["200"] >= 40 and load.failed == 0, load.outcomes
        assert {e["name"] for e in reg.entries()} == set(ctl.replicas)
        for e in ctl.replicas.values():
            assert f"gpu_{e.key.gpu}" in node_res[e.handle.info()["node"]]

        # kill the engine process inside its actor: restarted there, deregistered meanwhile, re-registered
        entry = ctl.replicas["large.llama-3.1-70b.rtx-pro-6000.tp2pp1.bf16.0"]
        assert entry.handle.kill_process()
        events: list[str] = []
        assert wait_for(lambda: bool(events.extend(ctl.check()) or f"re-registered {entry.key.id}" in events))
        assert entry.handle.info()["restarts"] == 1 and entry.key.id in {e["name"] for e in reg.entries()}
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=30,
            json={"model": "router-large", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4},
        )
        assert r.status_code == 200 and r.headers["x-boute-tier"] == "large"
    finally:
        if gw is not None:
            gw.stop(5)
        ctl.down()
        reg.clear()
    assert ray.util.placement_group_table() == {} or all(
        pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values()
    )
