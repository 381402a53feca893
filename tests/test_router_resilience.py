"""Shared state and failures with real processes: two gateways + Redis, Redis restart, backend kill."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections import Counter

import httpx
import pytest

from tests.closed_loop import ClosedLoop
from tests.services import free_port, start_redis
from tests.stack import TEST_PLAN, Stack
from tests.waits import SAFETY_S, until, until_async

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)

TOKEN = "t0k"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class _Load(ClosedLoop):
    """Closed-loop clients until stopped, counting each HTTP status (-1 = transport error). The chaos tests
    act on what the load has done (so many answers before, during and after a failure), never on how long
    it has run: a busy machine answers fewer requests per second, never a different outcome."""

    def __init__(self, url: str, workers: int = 12, model: str = "boute") -> None:
        super().__init__(url, workers)
        self.model = model
        self.statuses: Counter[int] = Counter()

    async def one(self, client: httpx.AsyncClient, worker: int, n: int) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": f"w{worker} r{n}"}], "max_tokens": 8}
        try:
            r = await client.post(self.url + "/v1/chat/completions", json=body)
            self.statuses[r.status_code] += 1
        except httpx.HTTPError:
            self.statuses[-1] += 1

    async def answers(self, more: int, what: str) -> None:
        """Wait for ``more`` further answers (of any status: a failure must not stall the wait)."""
        await self.reach(lambda: sum(self.statuses.values()), sum(self.statuses.values()) + more, what)


def test_plan_update_reaches_both_gateways(stack: Stack, redis_url: str) -> None:
    """A PUT on one gateway is applied by its peer through Redis pub/sub (nothing polls). How fast (the 1 s
    goal) is a wall-clock figure, measured by ``make bench`` (bench_plan_sync); here the wait is only bounded."""
    env = {"BOUTE_REDIS_URL": redis_url, "BOUTE_REDIS_PREFIX": f"t-{uuid.uuid4().hex}", "BOUTE_ADMIN_TOKEN": TOKEN}
    a, _ = stack.gateway(**env)
    b, _ = stack.gateway(**env)
    v0 = httpx.get(b + "/admin/plan", headers=AUTH).json()["version"]
    assert v0 == httpx.get(a + "/admin/plan", headers=AUTH).json()["version"]  # the second adopted the first's
    new = {**TEST_PLAN, "routing": {"tiers": ["small", "large"], "fractions": [0.0, 1.0]}}
    r = httpx.put(a + "/admin/plan", json=new, headers=AUTH)
    assert r.status_code == 200
    version = r.json()["version"]
    until(lambda: httpx.get(b + "/admin/plan", headers=AUTH).json()["version"] == version, "the peer adopted it")
    assert httpx.get(b + "/admin/plan", headers=AUTH).json()["plan"]["routing"]["fractions"] == [0.0, 1.0]
    short = {"model": "boute", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(b + "/v1/chat/completions", json=short).headers["x-boute-tier"] == "large"


async def test_redis_restart_mid_load_fails_no_request(stack: Stack) -> None:
    port, workdir = free_port(), tempfile.mkdtemp(prefix="boute-redis-")
    redis = start_redis(port, workdir)
    try:
        url, _ = stack.gateway(BOUTE_REDIS_URL=f"redis://127.0.0.1:{port}/0", BOUTE_ADMIN_TOKEN=TOKEN)
        async with httpx.AsyncClient() as c, _Load(url) as load:

            async def shared() -> bool:  # it reconnects by itself and re-seeds the empty Redis
                return bool((await c.get(url + "/admin/plan", headers=AUTH)).json()["shared"])

            await load.answers(20, "answers with Redis up")
            redis.kill()
            redis.wait(SAFETY_S)
            await load.answers(30, "answers with Redis down")
            redis = await asyncio.to_thread(start_redis, port, workdir)
            await until_async(shared, "the gateway reconnected to Redis")  # backoff <= 1 s
            await load.answers(20, "answers after the reconnect")
        assert set(load.statuses) == {200} and load.statuses[200] >= 70, load.statuses
        async with httpx.AsyncClient() as c:
            r = await c.put(url + "/admin/plan", json=TEST_PLAN, headers=AUTH)
            assert r.status_code == 200
    finally:
        redis.kill()
        redis.wait(SAFETY_S)
        shutil.rmtree(workdir, ignore_errors=True)


async def test_backend_killed_mid_load_fails_no_request(stack: Stack) -> None:
    url, _ = stack.gateway(BOUTE_ADMIN_TOKEN=TOKEN)
    async with _Load(url, model="router-small") as load:
        await load.answers(20, "answers from both small replicas")
        await asyncio.to_thread(stack.kill_replica, 0)  # the H100 replica of the small tier
        await load.answers(40, "answers after the kill")
    assert set(load.statuses) == {200} and load.statuses[200] >= 60, load.statuses
    backends = {b["gpu"] + b["tier"]: b for b in httpx.get(url + "/admin/backends", headers=AUTH).json()["backends"]}
    dead = backends["h100-sxmsmall"]
    assert not dead["healthy"] or dead["circuit"] == "open"
    assert backends["rtx-4090small"]["served"] > 0


def test_a_plan_whose_router_cannot_be_had_is_refused_and_never_reported_live(stack: Stack, redis_url: str) -> None:
    """A plan arriving over Redis whose router file is in no bundle and not in the shared store: the gateway
    keeps serving the previous plan and says so, rather than reporting the new version as live."""
    import orjson
    import redis

    from boute.serving import RedisKeys

    prefix = f"t-{uuid.uuid4().hex}"
    gw, _ = stack.gateway(BOUTE_REDIS_URL=redis_url, BOUTE_REDIS_PREFIX=prefix, BOUTE_ADMIN_TOKEN=TOKEN)
    before = httpx.get(gw + "/admin/plan", headers=AUTH).json()
    routing = {
        "tiers": ["small", "large"], "fractions": [0.5, 0.5], "scorer": "learned", "router": "gone/router.npz",
        "reference": "builtin:gsm8k",
    }  # fmt: skip
    plan = {**TEST_PLAN, "routing": routing, "artifacts": [{"path": "gone/router.npz", "sha256": "0" * 64}]}
    keys = RedisKeys(prefix)
    with redis.Redis.from_url(redis_url) as r:
        version = int(r.incr(keys.plan_version))
        r.set(keys.plan, orjson.dumps({"version": version, "plan": plan}))
        r.publish(keys.events, orjson.dumps({"kind": "plan", "version": version}))
    until(lambda: "refused" in httpx.get(gw + "/admin/plan", headers=AUTH).json(), "the gateway refused the plan")
    now = httpx.get(gw + "/admin/plan", headers=AUTH).json()
    assert now["version"] == before["version"] and now["plan"] == before["plan"]
    assert "gone/router.npz" in now["refused"] or "0000000000" in now["refused"]
    short = {"model": "boute", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(gw + "/v1/chat/completions", json=short).status_code == 200


def test_a_plan_put_on_one_gateway_carries_its_bundle_files_to_its_peers(stack: Stack, redis_url: str) -> None:
    """PUT /admin/plan uploads the plan's bundle files with it: a peer that never saw the sender's folder
    loads the plan from the shared store instead of refusing it."""
    import hashlib
    import json
    from pathlib import Path

    folder = Path(tempfile.mkdtemp(prefix="boute-bundle-"))
    try:
        lines = [{"prompt": "q" * (10 + 7 * i), "scores": {"small": 0.5, "large": 0.9}} for i in range(40)]
        ref = folder / "reference.jsonl"
        ref.write_text("".join(json.dumps(x) + "\n" for x in lines))
        routing = {**TEST_PLAN["routing"], "reference": "reference.jsonl"}
        sha = hashlib.sha256(ref.read_bytes()).hexdigest()
        plan = {**TEST_PLAN, "routing": routing, "artifacts": [{"path": "reference.jsonl", "sha256": sha}]}
        env = {"BOUTE_REDIS_URL": redis_url, "BOUTE_REDIS_PREFIX": f"t-{uuid.uuid4().hex}", "BOUTE_ADMIN_TOKEN": TOKEN}
        a, _ = stack.gateway(**env, BOUTE_BUNDLE_ROOT=str(folder))
        b, _ = stack.gateway(**env, BOUTE_CACHE_DIR=str(folder / "peer-cache"))
        r = httpx.put(a + "/admin/plan", json=plan, headers=AUTH)
        assert r.status_code == 200, r.text

        def adopted() -> bool:
            now = httpx.get(b + "/admin/plan", headers=AUTH).json()
            assert "refused" not in now, now["refused"]
            return now["version"] == r.json()["version"]

        until(adopted, "the peer adopted the plan")
        now = httpx.get(b + "/admin/plan", headers=AUTH).json()
        assert now["plan"]["routing"]["reference"] == "reference.jsonl"
        assert (folder / "peer-cache").is_dir()  # the peer's copy came from the shared store
    finally:
        shutil.rmtree(folder, ignore_errors=True)
