"""What to run for one replica: the emulated backend (``--emulate``) or SGLang, as a supervisor ProcessSpec.

Shared by the local target and the Ray actors, so a replica is the same command wherever it is placed;
only the host/port (chosen where it runs) differ. The gateway registry entry is built here too, so the
served model name in the command and in the registry can never disagree.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.deploy.desired import ReplicaKey
from backends.supervisor import ProcessSpec


@dataclass(frozen=True)
class LaunchOptions:
    """How replicas are started; picklable, so Ray actors receive it as is."""

    emulate: bool = True
    speedup: float = 1.0  # emulated only: modelled times are divided by this
    profile: str = "builtin:gsm8k"  # emulated: whose recorded responses known prompts get
    profile_models: Mapping[str, str] = field(default_factory=dict)  # tier -> profile column (emulated)
    model_paths: Mapping[str, str] = field(default_factory=dict)  # tier -> checkpoint / HF id (SGLang)
    catalog: str | None = None  # emulated: the plan's catalog file (its own GPUs/models, calibrated)
    mem_fraction_static: float = 0.88
    python: str = sys.executable


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def served_name(key: ReplicaKey, opts: LaunchOptions) -> str:
    """The model name the replica answers to: the catalog model (emulated), the tier name (SGLang)."""
    return key.model if opts.emulate else key.tier


def replica_process(
    key: ReplicaKey, port: int, host: str, opts: LaunchOptions, gpu_ids: Sequence[int] = ()
) -> ProcessSpec:
    """The supervised process for ``key`` listening on ``host:port``."""
    if opts.emulate:
        argv = [opts.python, "-m", "backends.emulated", "--model", key.model, "--gpu", key.gpu]
        argv += ["--tp", str(key.tp), "--pp", str(key.pp), "--dtype", key.dtype, "--host", host, "--port", str(port)]
        argv += ["--speedup", f"{opts.speedup:g}", "--profile", opts.profile]
        if key.tier in opts.profile_models:
            argv += ["--profile-model", opts.profile_models[key.tier]]
        if opts.catalog:
            argv += ["--catalog", opts.catalog]
        env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    else:
        from backends.sglang.command import SGLangOptions, sglang_argv
        from boute.catalog import builtin_catalog

        path = opts.model_paths.get(key.tier) or builtin_catalog().model(key.model).hf_id
        so = SGLangOptions(host=host, mem_fraction_static=opts.mem_fraction_static, python=opts.python)
        argv = sglang_argv(
            path, port=port, tp=key.tp, pp=key.pp, dtype=key.dtype, served_model_name=key.tier, options=so
        )
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpu_ids))} if gpu_ids else {}
    health_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return ProcessSpec(name=key.id, argv=tuple(argv), env=env, health_url=f"http://{health_host}:{port}/health")


def registry_entry(key: ReplicaKey, url: str, opts: LaunchOptions) -> dict[str, Any]:
    """The gateway ``BackendSpec`` for a running replica (name = the stable replica id)."""
    return {
        "url": url,
        "tier": key.tier,
        "model": served_name(key, opts),
        "gpu": key.gpu,
        "tp": key.tp,
        "pp": key.pp,
        "dtype": key.dtype,
        "name": key.id,
    }
