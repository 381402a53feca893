"""What to run for one replica: the emulated backend (``--emulate``) or SGLang, as a supervisor ProcessSpec.

Shared by the local target and the Ray actors, so a replica is the same command wherever it is placed;
only the host/port (chosen where it runs) differ. The gateway registry entry is built here too, so the
served model name in the command and in the registry can never disagree.

Where replicas listen (``boute deploy up --replica-host``, :func:`replica_address`): loopback by default for
emulated fleets and the local target (nothing leaves the machine), the node's own address for Ray fleets
of real engines (the gateway reaches them across nodes). A replica beyond loopback answers anyone who
reaches it unless the deployment sets ``BOUTE_REPLICA_TOKEN`` (:mod:`boute.serving.auth`): each replica is
then started with it (SGLang's ``--api-key``, the emulated backend's own check).
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.deploy.desired import ReplicaKey
from backends.supervisor import ProcessSpec
from boute.errors import BouteError
from boute.serving.auth import TOKEN_ENV

LOOPBACK = "127.0.0.1"
#: ``--replica-host`` value for "the address of the node the replica runs on" (Ray: the node IP Ray knows)
NODE = "node"
#: bind every interface; the registry gets the node's address
WILDCARDS = ("0.0.0.0", "::")


@dataclass(frozen=True)
class LaunchOptions:
    """How replicas are started; picklable, so Ray actors receive it as is."""

    emulate: bool = True
    speedup: float = 1.0  # emulated only: modelled times are divided by this
    profile: str = "builtin:gsm8k"  # emulated: whose recorded responses known prompts get
    profile_models: Mapping[str, str] = field(default_factory=dict)  # tier -> profile column (emulated)
    model_paths: Mapping[str, str] = field(default_factory=dict)  # tier -> checkpoint / HF id (SGLang)
    default_model_path: str | None = None  # SGLang: a tier without a model_paths entry (else its catalog hf_id)
    sglang_cpu: bool = False  # SGLang's CPU engine (backends.sglang.cpu): one CPU process per replica, no GPUs
    max_total_tokens: int | None = None  # sglang_cpu: the KV pool, tokens (None: cpu.DEFAULT_MAX_TOTAL_TOKENS)
    catalog: str | None = None  # emulated: the plan's catalog file (its own GPUs/models, calibrated)
    mem_fraction_static: float = 0.88
    python: str = sys.executable
    host: str = LOOPBACK  # where replicas listen: an address, a wildcard or NODE (replica_address)
    token: str | None = field(default=None, repr=False)  # BOUTE_REPLICA_TOKEN, handed to every replica


def default_replica_host(*, emulate: bool, target: str, ray_address: str | None = None) -> str:
    """``--replica-host`` when none is given: loopback for what runs on this machine only (emulated fleets
    without an external Ray cluster, and the local target), the node's address for Ray fleets."""
    if target == "local" or (emulate and ray_address is None):
        return LOOPBACK
    return NODE


def check_replica_host(value: str) -> str:
    """``value`` if it is an IP address, a wildcard or NODE; else a one-line BouteError."""
    if value != NODE:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise BouteError(
                f"--replica-host: expected an IP address (127.0.0.1: this machine only), 0.0.0.0 (every "
                f"interface) or '{NODE}' (the address of the node a replica runs on), got '{value}'"
            ) from None
    return value


def replica_address(host: str, node_ip: Callable[[], str]) -> tuple[str, str]:
    """(address a replica binds, address the gateway is given) for a ``--replica-host`` value: an address
    is both; NODE is the node's own address (``node_ip()``) for both; a wildcard binds every interface and
    registers the node's address."""
    if host == NODE:
        ip = node_ip()
        return ip, ip
    if host in WILDCARDS:
        return host, node_ip()
    return host, host


def outbound_ip() -> str:
    """This host's address on its default route (the local target's NODE). A UDP ``connect`` only picks the
    source address: no packet is sent. Loopback where the host has no route out."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
        except OSError:
            return LOOPBACK


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
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
        argv += ["--speedup", f"{opts.speedup:g}", "--profile", opts.profile, "--enable-cache-report"]
        if key.tier in opts.profile_models:
            argv += ["--profile-model", opts.profile_models[key.tier]]
        if opts.catalog:
            argv += ["--catalog", opts.catalog]
        env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
        if opts.token:  # read by the replica's own check (boute.serving.auth), not passed on the command line
            env[TOKEN_ENV] = opts.token
    else:
        from backends.sglang.command import LIVENESS_ENV, SGLangOptions, sglang_argv
        from boute.catalog import builtin_catalog

        path = opts.model_paths.get(key.tier) or opts.default_model_path or builtin_catalog().model(key.model).hf_id
        so = SGLangOptions(host=host, mem_fraction_static=opts.mem_fraction_static, python=opts.python)
        tp, pp, dtype = key.tp, key.pp, key.dtype
        if opts.sglang_cpu:  # the plan's GPU type, tp/pp and dtype only name the replica: one bf16 CPU process
            from dataclasses import replace  # serves it (fp8 is a GPU kernel SGLang's CPU engine does not have)

            from backends.sglang.cpu import DEFAULT_MAX_TOTAL_TOKENS, cpu_options

            tokens = opts.max_total_tokens or DEFAULT_MAX_TOTAL_TOKENS
            so = replace(cpu_options(opts.python, max_total_tokens=tokens), host=host)
            tp = pp = 1
            dtype = "bf16"
        argv = sglang_argv(path, port=port, tp=tp, pp=pp, dtype=dtype, served_model_name=key.tier, options=so)
        if opts.token:  # SGLang takes its key on the command line only (visible to local users in ps)
            argv += ["--api-key", opts.token]
        env = dict(LIVENESS_ENV)
        if gpu_ids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
        if opts.sglang_cpu:  # the model is a local folder: never reach for the Hub
            env.update({**so.extra_env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    health_host = LOOPBACK if host in WILDCARDS else host
    return ProcessSpec(name=key.id, argv=tuple(argv), env=env, health_url=f"{http_url(health_host, port)}/health")


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
