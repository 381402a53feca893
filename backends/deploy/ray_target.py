"""Ray target: each replica is a Ray actor, placed on a node with the right GPU type, that starts and
supervises the replica process there (restart with back-off, logs on that node).

Placement: with real GPUs an actor asks for ``num_gpus = tp * pp`` and ``accelerator_type`` (Ray's label
for the GPU model), so Ray sets ``CUDA_VISIBLE_DEVICES`` to exactly the GPUs the engine may use. Where
GPU types are stood in for by custom resources (tests, emulated fleets, clusters labelled by hand) the
actor asks for ``{"gpu_<type>": tp * pp}``. A multi-GPU replica first reserves its GPUs in a STRICT_PACK
placement group (all on one node, atomically, before anything starts) and the actor runs in that group;
stopping the replica removes the group, so the GPUs are free for the next one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Literal

from backends.deploy.desired import ReplicaKey
from backends.deploy.launch import LaunchOptions
from backends.supervisor import ReadinessError, RestartPolicy
from boute.errors import BouteError

ResourceMode = Literal["custom", "accelerator"]

#: catalog GPU name -> Ray accelerator_type (ray.util.accelerators); others fall back to an upper-cased name
RAY_ACCELERATOR: dict[str, str] = {
    "h100-sxm": "H100",
    "h100-pcie": "H100",
    "h200-sxm": "H200",
    "a100-80gb": "A100-80G",
    "a100-40gb": "A100-40G",
    "l4": "L4",
    "t4": "T4",
    "l40s": "L40S",
    "a40": "A40",
}


def resource_name(gpu: str) -> str:
    """The custom resource standing in for a GPU type (``ray start --resources '{"gpu_h100-sxm": 8}'``)."""
    return f"gpu_{gpu}"


def accelerator_type(gpu: str) -> str:
    return RAY_ACCELERATOR.get(gpu, gpu.upper())


def placement(key: ReplicaKey, mode: ResourceMode) -> tuple[dict[str, Any], list[dict[str, float]] | None]:
    """(actor resource options, placement-group bundles or None) for one replica."""
    n = key.gpus
    if mode == "custom":
        opts: dict[str, Any] = {"num_cpus": 0, "resources": {resource_name(key.gpu): n}}
        bundle: dict[str, float] = {resource_name(key.gpu): n}
    else:
        opts = {"num_cpus": 0, "num_gpus": n, "accelerator_type": accelerator_type(key.gpu)}
        bundle = {"GPU": n, f"accelerator_type:{accelerator_type(key.gpu)}": 0.001}
    return opts, ([bundle] if n > 1 else None)


class ReplicaActor:
    """Runs on the chosen node: picks a port there, starts the replica under a SupervisedProcess."""

    def __init__(self, key: ReplicaKey, opts: LaunchOptions, log_dir: str, policy: RestartPolicy) -> None:
        import ray

        from backends.deploy.launch import free_port, http_url, replica_address, replica_process
        from backends.supervisor import SupervisedProcess

        self.key = key
        self.node_ip = ray.util.get_node_ip_address()
        bind, self.host = replica_address(opts.host, lambda: self.node_ip)  # --replica-host (launch.py)
        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        self.resources = ctx.get_assigned_resources()
        gpu_ids = [int(g) for g in ray.get_gpu_ids()] if not opts.emulate else []
        port = free_port(bind)
        spec = replica_process(key, port, bind, opts, gpu_ids)
        if gpu_ids:  # Ray already restricted CUDA_VISIBLE_DEVICES for this actor; keep its view
            spec = type(spec)(
                spec.name,
                spec.argv,
                {k: v for k, v in spec.env.items() if k != "CUDA_VISIBLE_DEVICES"},
                spec.health_url,
                spec.cwd,
            )
        self.url = http_url(self.host, port)
        self.proc = SupervisedProcess(spec, log_dir, policy).start()

    def info(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "pid": self.proc.pid,
            "restarts": self.proc.restarts,
            "running": self.proc.running,
            "gave_up": self.proc.gave_up,
            "node": self.node_id,
            "node_ip": self.node_ip,
            "resources": self.resources,
            "log": str(self.proc.log_path),
        }

    def wait_ready(self, timeout_s: float) -> float | str:
        try:
            return self.proc.wait_ready(timeout_s)
        except ReadinessError as exc:  # travels back as text: the driver raises it as a one-line error
            return str(exc)

    def kill_process(self) -> int | None:
        """SIGKILL the replica process (not the actor): what a crash looks like; the supervisor restarts it."""
        pid = self.proc.pid
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self, grace_s: float) -> int | None:
        return self.proc.stop(grace_s)


class RayReplica:
    def __init__(self, key: ReplicaKey, actor: Any, pg: Any, url: str) -> None:
        self.key, self.actor, self.pg, self.url = key, actor, pg, url
        self._info: dict[str, Any] = {}

    def wait_ready(self, timeout_s: float) -> float:
        import ray

        res = ray.get(self.actor.wait_ready.remote(timeout_s), timeout=timeout_s + 30)
        if isinstance(res, str):
            raise ReadinessError(res)
        return float(res)

    def info(self) -> dict[str, Any]:
        import ray

        try:
            self._info = ray.get(self.actor.info.remote(), timeout=10)
            self._info["actor_alive"] = True
        except Exception as exc:  # actor died (node lost): report, the controller replaces the replica
            self._info = {**self._info, "actor_alive": False, "error": type(exc).__name__}
        return dict(self._info)

    def kill_process(self) -> int | None:
        import ray

        return ray.get(self.actor.kill_process.remote(), timeout=10)

    def stop(self, grace_s: float = 10.0) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        with contextlib.suppress(Exception):
            ray.get(self.actor.stop.remote(grace_s), timeout=grace_s + 20)
        ray.kill(self.actor, no_restart=True)
        if self.pg is not None:
            remove_placement_group(self.pg)


class RayTarget:
    """Replicas as Ray actors; ``ray.init`` must have been called (the daemon or the test does it)."""

    name = "ray"

    def __init__(
        self,
        log_dir: str | Path,
        opts: LaunchOptions,
        mode: ResourceMode = "custom",
        policy: RestartPolicy | None = None,
        schedule_timeout_s: float = 60.0,
    ) -> None:
        self.log_dir, self.opts, self.mode = str(log_dir), opts, mode
        self.policy = policy or RestartPolicy(backoff_initial_s=0.2, backoff_max_s=5.0, stable_after_s=10.0)
        self.schedule_timeout_s = schedule_timeout_s

    def start(self, key: ReplicaKey) -> RayReplica:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_opts, bundles = placement(key, self.mode)
        pg = None
        if bundles is not None:
            pg = placement_group(bundles, strategy="STRICT_PACK", name=f"boute-{key.id}")
            try:
                ray.get(pg.ready(), timeout=self.schedule_timeout_s)
            except Exception:
                remove_placement_group(pg)
                raise BouteError(
                    f"replica {key.id}: no node offers {bundles[0]} within {self.schedule_timeout_s:g}s "
                    "(is a node with that GPU type free?)"
                ) from None
            actor_opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
        cls = ray.remote(max_concurrency=4, max_restarts=0)(ReplicaActor)
        actor = cls.options(name=f"boute-{key.id}-{time.time_ns()}", **actor_opts).remote(
            key, self.opts, self.log_dir, self.policy
        )
        try:
            url = ray.get(actor.info.remote(), timeout=self.schedule_timeout_s)["url"]
        except Exception:
            ray.kill(actor, no_restart=True)
            if pg is not None:
                remove_placement_group(pg)
            want = actor_opts.get("resources") or {
                "GPU": key.gpus,
                "accelerator_type": actor_opts.get("accelerator_type"),
            }
            raise BouteError(
                f"replica {key.id}: not scheduled within {self.schedule_timeout_s:g}s (needs {want})"
            ) from None
        return RayReplica(key, actor, pg, url)

    def close(self) -> None:
        """Actors are stopped through their handles; the Ray connection belongs to whoever opened it."""
