"""Register deployed endpoints with the gateways, in the shared Redis layout (``boute.serving``).

The gateway keeps its backend registry as one JSON list (``<prefix>:backends``, entries validated by
``boute.serving.BackendSpec``) and re-reads it when ``{"kind": "backends"}`` is published on
``<prefix>:events``; the active plan is ``<prefix>:plan`` = ``{"version", "plan"}`` with the version from
``<prefix>:plan:version``. Several writers (deploy controllers, admins) may touch the list, so every change
is a read-modify-write under WATCH/MULTI and retried on conflict: no registration is ever lost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from boute.errors import BouteError
from boute.serving import BackendSpec, RedisKeys
from boute.serving.bundle import bundle_files
from boute.specs.plan import Plan


class RegistryError(BouteError):
    """Redis cannot be reached or written: the gateway would not learn about the change."""


class Registry:
    """Backend registry + active plan in Redis, for gateways started with ``--redis URL --redis-prefix P``."""

    def __init__(self, redis_url: str, prefix: str = "boute") -> None:
        import redis

        self.url, self.prefix = redis_url, prefix
        self.keys = keys = RedisKeys(prefix)
        self.k_backends, self.k_plan, self.k_plan_version, self.channel = (
            keys.backends,
            keys.plan,
            keys.plan_version,
            keys.events,
        )
        self._r = redis.Redis.from_url(redis_url, socket_connect_timeout=2.0, socket_timeout=5.0)

    def _change(self, fn: Any) -> list[dict[str, Any]]:
        """Apply ``fn(entries) -> entries`` atomically and tell the gateways."""
        import redis

        try:
            with self._r.pipeline() as pipe:
                while True:
                    try:
                        pipe.watch(self.k_backends)
                        raw = pipe.get(self.k_backends)
                        entries = fn(json.loads(raw) if raw else [])
                        pipe.multi()
                        pipe.set(self.k_backends, json.dumps(entries))
                        pipe.publish(self.channel, json.dumps({"kind": "backends"}))
                        pipe.execute()
                        return entries
                    except redis.WatchError:
                        continue
        except redis.RedisError as exc:
            raise RegistryError(f"backend registry at {self.url} ({self.k_backends}): {exc}") from None

    def register(self, entry: dict[str, Any]) -> None:
        """Add (or replace, by ``name``) one backend; the entry must be a valid gateway ``BackendSpec``."""
        spec = BackendSpec.model_validate(entry).model_dump(mode="json", exclude_none=True)
        self._change(lambda es: [e for e in es if e.get("name") != spec["name"]] + [spec])

    def deregister(self, name: str) -> None:
        self._change(lambda es: [e for e in es if e.get("name") != name])

    def deregister_many(self, names: set[str]) -> None:
        self._change(lambda es: [e for e in es if e.get("name") not in names])

    def entries(self) -> list[dict[str, Any]]:
        import redis

        try:
            raw = self._r.get(self.k_backends)
        except redis.RedisError as exc:
            raise RegistryError(f"backend registry at {self.url}: {exc}") from None
        return json.loads(raw) if raw else []

    def publish_plan(self, plan: Plan, root: Path | None = None) -> int:
        """Make ``plan`` the gateways' active plan (same document and event as ``PUT /admin/plan``); its bundle
        files (found under ``root``, the plan's folder) go to the shared store first, so every gateway can
        load the plan's router wherever it runs."""
        import redis

        if plan.artifacts and root is None:
            raise RegistryError(f"plan names bundle file '{plan.artifacts[0].path}' but no folder to read it from")
        files = bundle_files(plan, root) if root is not None else []
        try:
            for sha, data in files:
                self._r.set(self.keys.artifact(sha), data, nx=True)
            version = int(self._r.incr(self.k_plan_version))
            doc = {"version": version, "plan": plan.model_dump(mode="json", exclude_none=True)}
            self._r.set(self.k_plan, json.dumps(doc))
            self._r.publish(self.channel, json.dumps({"kind": "plan", "version": version}))
            return version
        except redis.RedisError as exc:
            raise RegistryError(f"plan at {self.url} ({self.k_plan}): {exc}") from None

    def clear(self) -> None:
        """Remove everything under this prefix: registry, plan, bundle files, observations (tests, the live
        evaluator's throw-away prefixes)."""
        artifacts = list(self._r.scan_iter(match=self.keys.artifact("*"), count=500))
        self._r.delete(self.k_backends, self.k_plan, self.k_plan_version, self.keys.observations, *artifacts)
        self._r.publish(self.channel, json.dumps({"kind": "backends"}))

    def close(self) -> None:
        self._r.close()
