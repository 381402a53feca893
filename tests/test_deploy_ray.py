"""Ray target: a local two-node Ray cluster whose custom resources stand in for GPU types; replicas are
actors that must land on the node offering their GPU type, serve through the gateway, survive a rolling
update under load with zero failed requests, and come back (re-registered) after their process is killed."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest

from backends.deploy.controller import Controller
from backends.deploy.desired import ReplicaKey
from backends.deploy.gateway import start_gateway
from backends.deploy.launch import LaunchOptions
from backends.deploy.ray_target import RayTarget, placement
from backends.deploy.registry import Registry
from boute.specs.plan import Plan
from tests.deploy_helpers import PLAN_A, PLAN_B, Load, wait_for

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


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": HEAD, "include_dashboard": False})
    c.add_node(num_cpus=1, resources=WORKER)
    ray.init(address=c.address, namespace="boute-test", log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


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
        url, gw = start_gateway(reg.url, reg.prefix, tmp_path)
        assert wait_for(lambda: httpx.get(url + "/ready").status_code == 200, 30)
        with Load(url, clients=3) as load:
            time.sleep(0.5)
            ctl.apply(Plan.model_validate(PLAN_B))
            time.sleep(0.5)
        assert load.outcomes["200"] > 50 and load.failed == 0, load.outcomes
        assert {e["name"] for e in reg.entries()} == set(ctl.replicas)
        for e in ctl.replicas.values():
            assert f"gpu_{e.key.gpu}" in node_res[e.handle.info()["node"]]

        # kill the engine process inside its actor: restarted there, deregistered meanwhile, re-registered
        entry = ctl.replicas["large.llama-3.1-70b.rtx-pro-6000.tp2pp1.bf16.0"]
        assert entry.handle.kill_process()
        events: list[str] = []
        assert wait_for(lambda: bool(events.extend(ctl.check()) or f"re-registered {entry.key.id}" in events), 30)
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
