"""Shared state: the active plan and backend registry, mirrored between gateway instances through Redis.

Why this shape: the request hot path must never wait on Redis, so every instance keeps the state in
process memory and Redis is only the rendezvous. A ``PUT /admin/plan`` writes the plan (with a
monotonically increasing version) and publishes it; every instance's subscriber applies it within
milliseconds. If Redis goes away, instances keep serving on their last-known plan and the subscriber
reconnects with backoff, re-reading the stored plan on reconnect so no update is missed.

Health: a replica one instance trips is written as ``<prefix>:down:<id>`` with the cooldown as TTL (the one
TTL of the design) and announced on the channel, so peers stop sending to it too; expiry needs no cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from boute.serving import BACKENDS, BackendSpec, RedisKeys
from boute.specs.plan import Plan
from router.config import Settings
from router.errors import SharedStateUnavailable

log = logging.getLogger("boute.router.state")


#: adopt a plan and registry; False when the plan is refused (its routing cannot be compiled): the previous
#: plan stays live and is what the state reports
Listener = Callable[[Plan | None, list[BackendSpec]], bool]
#: compile a plan off the event loop before it is adopted (bundle files fetched, hashed, router loaded)
Preparer = Callable[[Plan], object]
DownListener = Callable[[str, float], None]


class SharedState:
    """In-process copy of the plan + registry, kept in sync with Redis when ``settings.redis_url`` is set."""

    def __init__(
        self, settings: Settings, on_change: Listener, on_down: DownListener, prepare: Preparer | None = None
    ) -> None:
        self.settings = settings
        self.plan: Plan | None = None
        self.plan_version = 0
        self.backends: list[BackendSpec] = []
        self.connected = False
        self._on_change = on_change
        self._on_down = on_down
        self._prepare = prepare
        self.keys = keys = RedisKeys(settings.redis_prefix)
        self.k_plan, self.k_plan_version, self.k_backends, self.k_down, self.channel = (
            keys.plan,
            keys.plan_version,
            keys.backends,
            keys.down_prefix,
            keys.events,
        )
        self._redis: Any = None
        self._task: asyncio.Task[None] | None = None
        self._bg: set[asyncio.Task[Any]] = set()

    # ---- lifecycle ----------------------------------------------------------------------------
    async def start(self, plan: Plan | None, backends: list[BackendSpec]) -> None:
        """Adopt the local plan/registry, then (with Redis) prefer what Redis holds and keep following it."""
        self._apply(plan, backends, version=0)
        if self.settings.redis_url is None:
            return
        import redis.asyncio as aioredis

        self._redis = aioredis.from_url(
            self.settings.redis_url, socket_connect_timeout=1.0, socket_timeout=2.0, retry_on_timeout=False
        )
        self._task = asyncio.create_task(self._follow(), name="boute-state-follow")
        for _ in range(40):  # up to 2 s for the first sync; after that, serve on the local plan
            if self.connected:
                break
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for t in list(self._bg):
            t.cancel()
        if self._redis is not None:
            await self._redis.aclose()

    # ---- writes (admin) -----------------------------------------------------------------------
    async def put_plan(self, plan: Plan, files: Sequence[tuple[str, bytes]] = ()) -> int:
        """Store + publish a validated plan, its bundle ``files`` (sha256, bytes) first so that every peer can
        load it; applied locally at once. Raises SharedStateUnavailable."""
        if self._redis is None:
            self._apply(plan, self.backends, version=self.plan_version + 1)
            return self.plan_version
        data = plan.model_dump(mode="json", exclude_none=True)
        try:
            for sha, blob in files:
                await self._redis.set(self.keys.artifact(sha), blob, nx=True)
            version = int(await self._redis.incr(self.k_plan_version))
            doc = orjson.dumps({"version": version, "plan": data})
            await self._redis.set(self.k_plan, doc)
            await self._redis.publish(self.channel, orjson.dumps({"kind": "plan", "version": version}))
        except Exception as exc:  # redis errors, OSError
            raise SharedStateUnavailable(exc) from None
        self._apply(plan, self.backends, version=version)
        return version

    async def put_backends(self, backends: list[BackendSpec]) -> None:
        if self._redis is not None:
            try:
                await self._redis.set(self.k_backends, BACKENDS.dump_json(backends))
                await self._redis.publish(self.channel, orjson.dumps({"kind": "backends"}))
            except Exception as exc:
                raise SharedStateUnavailable(exc) from None
        self._apply(self.plan, backends, version=self.plan_version)

    def report_down(self, backend_id: str) -> None:
        """Fire-and-forget: tell peers a replica tripped (never blocks or fails a request)."""
        if self._redis is None or not self.connected:
            return
        task = asyncio.create_task(self._report_down(backend_id))
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _report_down(self, backend_id: str) -> None:
        ttl = self.settings.cooldown_s
        try:
            await self._redis.set(self.k_down + backend_id, b"1", px=int(ttl * 1000))
            await self._redis.publish(self.channel, orjson.dumps({"kind": "down", "id": backend_id, "ttl": ttl}))
        except Exception as exc:
            log.debug("report_down failed: %s", exc)

    def fetch_artifact(self, sha256: str) -> bytes | None:
        """A plan bundle file's bytes from the shared store (blocking: called while compiling a plan)."""
        if self.settings.redis_url is None:
            return None
        import redis

        try:
            with redis.Redis.from_url(self.settings.redis_url, socket_connect_timeout=1.0, socket_timeout=5.0) as r:
                data = r.get(self.keys.artifact(sha256))
        except redis.RedisError as exc:
            log.warning("artifact %s: shared store unavailable: %s", sha256[:12], exc)
            return None
        return bytes(data) if data is not None else None

    # ---- following Redis ----------------------------------------------------------------------
    def _apply(self, plan: Plan | None, backends: list[BackendSpec], version: int) -> None:
        """Adopt ``backends`` and, unless the listener refuses it, ``plan`` as ``version``: a refused plan is
        never reported as live (``/admin/plan``, ``/ready``, the controller and the re-planner read these)."""
        self.backends = backends
        if self._on_change(plan, backends):
            self.plan, self.plan_version = plan, version

    async def _sync(self) -> None:
        """Read what Redis holds; seed it with the local plan/registry when it holds none."""
        r = self._redis
        raw_plan, raw_backends = await r.get(self.k_plan), await r.get(self.k_backends)
        plan, version, backends = self.plan, self.plan_version, self.backends
        if raw_plan is None and self.plan is not None:
            version = int(await r.incr(self.k_plan_version))
            doc = {"version": version, "plan": self.plan.model_dump(mode="json", exclude_none=True)}
            if not await r.set(self.k_plan, orjson.dumps(doc), nx=True):
                raw_plan = await r.get(self.k_plan)  # a peer seeded first: follow it
        if raw_plan is not None:
            try:
                doc = orjson.loads(raw_plan)
                if int(doc["version"]) != self.plan_version or self.plan is None:
                    plan, version = Plan.model_validate(doc["plan"]), int(doc["version"])
            except Exception as exc:  # a corrupt key must not take the gateway down
                log.warning("ignoring invalid plan in Redis: %s", exc)
        if raw_backends is None and self.backends:
            await r.set(self.k_backends, BACKENDS.dump_json(self.backends), nx=True)
        elif raw_backends is not None:
            try:
                backends = BACKENDS.validate_json(raw_backends)
            except Exception as exc:
                log.warning("ignoring invalid backend registry in Redis: %s", exc)
        if (plan, backends, version) != (self.plan, self.backends, self.plan_version):
            if plan is not None and plan != self.plan and self._prepare is not None:
                # compiling reads bundle files (Redis, disk), hashes them and scores the reference prompts:
                # tens of ms that must not stall requests in flight; adoption itself then finds it compiled
                try:
                    await asyncio.to_thread(self._prepare, plan)
                except Exception as exc:  # refused below, on the loop, with its reason recorded
                    log.debug("plan %s did not compile off the loop: %s", version, exc)
            self._apply(plan, backends, version)
        async for key in r.scan_iter(match=self.k_down + "*", count=100):
            ttl_ms = await r.pttl(key)
            if ttl_ms and ttl_ms > 0:
                self._on_down(key.decode()[len(self.k_down) :], ttl_ms / 1000)

    async def _follow(self) -> None:
        """Subscribe, sync, then apply published changes; on any connection error retry with backoff."""
        backoff = 0.05
        while True:
            pubsub = None
            try:
                pubsub = self._redis.pubsub()
                await pubsub.subscribe(self.channel)  # subscribe before reading: no update falls in between
                await self._sync()
                if not self.connected:
                    log.info("shared state: connected to Redis")
                self.connected, backoff = True, 0.05
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        await self._handle(orjson.loads(msg["data"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.connected:
                    log.warning("shared state: Redis lost (%s); serving on last-known plan", exc)
                self.connected = False
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()

    async def _handle(self, event: dict[str, Any]) -> None:
        kind = event.get("kind")
        if kind == "down":
            self._on_down(str(event["id"]), float(event["ttl"]))
        elif kind == "plan" and int(event.get("version", 0)) > self.plan_version or kind == "backends":
            await self._sync()
