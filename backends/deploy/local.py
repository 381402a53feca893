"""Local target: each replica is a supervised process on this host, on a free port of the interface
``LaunchOptions.host`` names (loopback unless ``--replica-host`` says otherwise).

Emulated replicas and SGLang's CPU engine (``--sglang-cpu``) need no GPUs; SGLang replicas take ``tp * pp``
CUDA ids of their GPU type from the pool given at construction (``--gpu-ids h100-sxm=0,1,2,3``), returned when
the replica stops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from backends.deploy.desired import ReplicaKey
from backends.deploy.launch import LaunchOptions, free_port, http_url, outbound_ip, replica_address, replica_process
from backends.supervisor import RestartPolicy, SupervisedProcess
from boute.errors import BouteError


class LocalReplica:
    def __init__(
        self, key: ReplicaKey, proc: SupervisedProcess, url: str, gpu_ids: list[int], owner: LocalTarget
    ) -> None:
        self.key, self.proc, self.url, self.gpu_ids, self._owner = key, proc, url, gpu_ids, owner

    def wait_ready(self, timeout_s: float) -> float:
        return self.proc.wait_ready(timeout_s)

    def info(self) -> dict[str, Any]:
        return {
            "pid": self.proc.pid,
            "restarts": self.proc.restarts,
            "running": self.proc.running,
            "gave_up": self.proc.gave_up,
            "node": "local",
            "gpu_ids": self.gpu_ids,
            "log": str(self.proc.log_path),
        }

    def stop(self, grace_s: float = 10.0) -> None:
        self.proc.stop(grace_s)
        self._owner._release(self.key.gpu, self.gpu_ids)


class LocalTarget:
    name = "local"

    def __init__(
        self,
        log_dir: str | Path,
        opts: LaunchOptions,
        policy: RestartPolicy | None = None,
        gpu_ids: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self.log_dir, self.opts = Path(log_dir), opts
        self.bind, self.host = replica_address(opts.host, outbound_ip)
        self.policy = policy or RestartPolicy(backoff_initial_s=0.2, backoff_max_s=5.0, stable_after_s=10.0)
        self._free = {g: list(ids) for g, ids in (gpu_ids or {}).items()}

    def _take(self, key: ReplicaKey) -> list[int]:
        if self.opts.emulate or self.opts.sglang_cpu:
            return []
        pool = self._free.get(key.gpu, [])
        if len(pool) < key.gpus:
            raise BouteError(
                f"replica {key.id}: needs {key.gpus} {key.gpu} GPUs, {len(pool)} free on this host "
                f"(give them with --gpu-ids {key.gpu}=0,1,...)"
            )
        ids, pool[:] = pool[: key.gpus], pool[key.gpus :]
        return ids

    def _release(self, gpu: str, ids: list[int]) -> None:
        if ids:
            self._free.setdefault(gpu, []).extend(ids)

    def start(self, key: ReplicaKey) -> LocalReplica:
        ids = self._take(key)
        port = free_port(self.bind)
        spec = replica_process(key, port, self.bind, self.opts, ids)
        proc = SupervisedProcess(spec, self.log_dir, self.policy).start()
        return LocalReplica(key, proc, http_url(self.host, port), ids, self)

    def close(self) -> None:
        """Nothing shared to release: each replica is stopped through its handle."""
