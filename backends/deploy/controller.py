"""The deployment controller: desired plan -> rolling update on a target -> registered, watched replicas.

One object drives one fleet. ``apply(plan)`` runs the rolling update; ``check()`` is one pass of the
watch loop: a replica that stops answering its health URL is taken out of the gateway registry, and put
back once its supervisor restarted it and it answers again (a replica whose actor or supervisor gave up
is replaced). The controller never calls the gateway: Redis is the only contract between them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from backends.deploy.desired import ReplicaKey, desired_replicas
from backends.deploy.launch import LaunchOptions, registry_entry
from backends.deploy.registry import Registry
from backends.deploy.rollout import Step, execute, plan_rollout
from backends.deploy.state import write_state
from backends.deploy.target import ReplicaHandle, Target
from boute.serving.auth import auth_headers
from boute.specs.plan import Plan

log = logging.getLogger("boute.deploy")


@dataclass
class Entry:
    key: ReplicaKey
    handle: ReplicaHandle
    registered: bool = False
    healthy: bool = False
    reregistrations: int = 0


class Controller:
    def __init__(
        self,
        target: Target,
        registry: Registry,
        opts: LaunchOptions,
        state_dir: Path | None = None,
        *,
        ready_timeout_s: float = 120.0,
        drain_timeout_s: float = 30.0,
        propagation_s: float = 0.3,
        stop_grace_s: float = 10.0,
        capacity: Mapping[str, int] | None = None,
    ) -> None:
        """``capacity``: GPUs of each type the target offers (the cluster inventory); rolling updates then
        order their steps to fit it (``backends.deploy.rollout``). ``None``: assume room for every step."""
        self.target, self.registry, self.opts, self.state_dir = target, registry, opts, state_dir
        self.capacity = dict(capacity) if capacity is not None else None
        self.ready_timeout_s, self.drain_timeout_s = ready_timeout_s, drain_timeout_s
        self.propagation_s, self.stop_grace_s = propagation_s, stop_grace_s
        self.replicas: dict[str, Entry] = {}
        self.plan: Plan | None = None
        self.generation = 0
        self.plan_version = 0  # the gateway plan version of the last publish
        self.status, self.error = "starting", None
        self.extra: dict[str, Any] = {}  # daemon facts for the state file (pid, gateway url, ...)
        self.plan_root: Path | None = state_dir  # where the plans' bundle files lie (desired.json's folder)
        self.steps_done: list[str] = []
        # the replicas' token, when set: /get_server_info (the drain's load figure) needs it, /health does not
        self._http = httpx.Client(timeout=1.0, trust_env=False, headers=auth_headers(opts.token))

    # ---- rolling update ------------------------------------------------------------------------
    def apply(self, plan: Plan) -> list[Step]:
        """Move the fleet to ``plan``; raises RolloutError (fleet left serving on what it had) on failure."""
        current = [e.key for e in self.replicas.values()]
        steps = plan_rollout(current, desired_replicas(plan), self.capacity)
        self.status, self.error = "updating", None
        self.save()
        ops = {
            "start": self._start,
            "ready": self._ready,
            "register": self._register,
            "publish_plan": lambda _k: self._publish(plan),
            "deregister": self._deregister,
            "drain": self._drain,
            "stop": self._stop,
        }
        try:
            execute(steps, ops, on_step=self._on_step, on_fail=self._on_fail)
        except Exception as exc:
            self.status, self.error = "failed", str(exc)
            self.save()
            raise
        self.plan, self.generation, self.status = plan, self.generation + 1, "ready"
        self.save()
        return steps

    def _on_step(self, _i: int, step: Step) -> None:
        self.steps_done.append(str(step))
        log.info("step: %s", step)
        self.save()

    def _on_fail(self, step: Step, exc: Exception) -> None:
        log.warning("step failed: %s: %s", step, exc)
        if step.replica is not None and step.action in ("start", "ready", "register"):
            e = self.replicas.pop(step.replica.id, None)
            if e is not None:
                if e.registered:
                    self.registry.deregister(e.key.id)
                e.handle.stop(self.stop_grace_s)

    def _start(self, key: ReplicaKey | None) -> None:
        assert key is not None
        self.replicas[key.id] = Entry(key, self.target.start(key))

    def _ready(self, key: ReplicaKey | None) -> None:
        assert key is not None
        self.replicas[key.id].handle.wait_ready(self.ready_timeout_s)
        self.replicas[key.id].healthy = True

    def _register(self, key: ReplicaKey | None) -> None:
        assert key is not None
        e = self.replicas[key.id]
        self.registry.register(registry_entry(key, e.handle.url, self.opts))
        e.registered = True

    def _publish(self, plan: Plan) -> None:
        self.plan_version = self.registry.publish_plan(plan, self.plan_root)
        time.sleep(self.propagation_s)

    def _deregister(self, key: ReplicaKey | None) -> None:
        assert key is not None
        self.registry.deregister(key.id)
        self.replicas[key.id].registered = False
        time.sleep(self.propagation_s)  # gateways apply the change within milliseconds of the publish

    def _drain(self, key: ReplicaKey | None) -> None:
        """Wait until the replica has nothing in flight (emulated/SGLang server info), at most drain_timeout_s."""
        assert key is not None
        url = self.replicas[key.id].handle.url
        deadline = time.monotonic() + self.drain_timeout_s
        while time.monotonic() < deadline:
            try:
                info = self._http.get(url + "/get_server_info").json()
                busy = int(info.get("running", 0)) + int(info.get("waiting", 0))
            except (httpx.HTTPError, ValueError, TypeError, AttributeError):
                return  # no load figure (or gone): the propagation pause was the drain
            if busy == 0:
                return
            time.sleep(0.05)

    def _stop(self, key: ReplicaKey | None) -> None:
        assert key is not None
        self.replicas.pop(key.id).handle.stop(self.stop_grace_s)

    # ---- watching ------------------------------------------------------------------------------
    def _answers(self, url: str) -> bool:
        try:
            return self._http.get(url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def check(self) -> list[str]:
        """One watch pass; returns what changed ("deregistered <id>", "re-registered <id>", "replaced <id>")."""
        events: list[str] = []
        for e in list(self.replicas.values()):
            ok = self._answers(e.handle.url)
            if ok and not e.registered:
                self.registry.register(registry_entry(e.key, e.handle.url, self.opts))
                e.registered, e.reregistrations = True, e.reregistrations + 1
                events.append(f"re-registered {e.key.id}")
            elif not ok and e.registered:
                self.registry.deregister(e.key.id)
                e.registered = False
                events.append(f"deregistered {e.key.id}")
            e.healthy = ok
            if not ok:
                info = e.handle.info()
                if info.get("gave_up") or info.get("actor_alive") is False:
                    e.handle.stop(1.0)
                    e.handle = self.target.start(e.key)  # registered again by a later pass once it answers
                    events.append(f"replaced {e.key.id}")
        for ev in events:
            log.info("watch: %s", ev)
        if events:
            self.save()
        return events

    # ---- teardown + state ----------------------------------------------------------------------
    def down(self) -> None:
        """Deregister everything first (the gateway stops sending), then stop the replicas."""
        names = {e.key.id for e in self.replicas.values()}
        if names:
            try:
                self.registry.deregister_many(names)
            except Exception as exc:  # Redis gone: still stop the processes
                log.warning("deregister on down failed: %s", exc)
        for e in list(self.replicas.values()):
            e.handle.stop(self.stop_grace_s)
        self.replicas.clear()
        self.status = "stopped"
        self.save()
        self._http.close()

    def snapshot(self) -> dict[str, Any]:
        reps = []
        for e in self.replicas.values():
            info = e.handle.info()
            reps.append(
                {
                    "id": e.key.id,
                    **e.key.to_dict(),
                    "url": e.handle.url,
                    "registered": e.registered,
                    "healthy": e.healthy,
                    "reregistrations": e.reregistrations,
                    **info,
                }
            )
        return {
            "status": self.status,
            "error": self.error,
            "generation": self.generation,
            "target": self.target.name,
            "emulate": self.opts.emulate,
            "speedup": self.opts.speedup,
            "replica_host": self.opts.host,  # the interface replicas listen on (--replica-host)
            "token": self.opts.token is not None,  # whether they require BOUTE_REPLICA_TOKEN (never the token)
            "registry": {"redis_url": self.registry.url, "prefix": self.registry.prefix},
            "plan": self.plan.model_dump(mode="json", exclude_none=True) if self.plan else None,
            "replicas": reps,
            "steps": self.steps_done[-200:],
            **self.extra,
        }

    def save(self) -> None:
        if self.state_dir is not None:
            write_state(self.state_dir, self.snapshot())
