"""Plan replica -> the ``python -m sglang.launch_server`` command that serves it.

Pure functions: the deployer (local processes or Ray actors) decides *where* a replica runs; this module
only says *what* to run there: the argv, ``CUDA_VISIBLE_DEVICES`` for the replica's GPU ids, the health URL
the supervisor waits on, and the name the gateway routes to. Keeping it pure lets the command be checked
against SGLang's real argument parser on GPU hosts and against a documented flag list elsewhere.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from backends.supervisor import ProcessSpec
from boute.catalog import Catalog
from boute.errors import BouteError
from boute.specs.plan import Plan, ReplicaGroup

__all__ = ["BARE_FLAGS", "LIVENESS_ENV", "SGLangOptions", "argv_flags", "place_plan", "replica_spec", "sglang_argv"]

#: ``/health`` as a liveness check (200 once warmed up, at once). By default SGLang (0.5.23) answers it like
#: ``/health_generate``: it queues a one-token generation and sleeps a whole second before looking, so no
#: answer ever came within the deployer's and the gateway's 1 s health timeouts: on real CPU replicas the
#: controller deregistered both tiers every few seconds and the gateway answered 503 "no healthy replica".
#: ``/health_generate`` still makes the deep check.
LIVENESS_ENV = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}

#: the flags :func:`sglang_argv` emits that take no value (SGLang's ``store_true``); every other one takes one.
#: The contract tests check this set against SGLang's own parser, so :func:`argv_flags` cannot silently misread.
BARE_FLAGS = frozenset({"--enable-cache-report"})


@dataclass(frozen=True)
class SGLangOptions:
    """Engine settings shared by every replica of a deployment (per-tier overrides via ``replace``)."""

    host: str = "127.0.0.1"
    mem_fraction_static: float = 0.88  # the performance model's default pool share (boute.perf.model)
    chunked_prefill_size: int | None = 8192
    context_length: int | None = None
    #: ``--enable-cache-report``: SGLang then puts each request's prefix-cache hit in the OpenAI usage
    #: (``prompt_tokens_details.cached_tokens``); without it that field is null and only ``/generate``'s
    #: ``meta_info`` has the hit. BOute reads hits from the usage (docs/prefix-cache.md), so it is on by default.
    enable_cache_report: bool = True
    python: str = sys.executable
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise BouteError(f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size == 0:
            raise BouteError("chunked_prefill_size must be positive, or -1 to disable chunking")


def sglang_argv(
    model_path: str,
    *,
    port: int,
    tp: int = 1,
    pp: int = 1,
    dtype: str = "bf16",
    served_model_name: str | None = None,
    options: SGLangOptions | None = None,
) -> list[str]:
    """The launch command for one replica; ``dtype='fp8'`` becomes ``--quantization fp8``.

    Every flag takes one value except the bare ``--enable-cache-report`` (``options.enable_cache_report``).
    """
    o = options or SGLangOptions()
    if tp < 1 or pp < 1:
        raise BouteError(f"tp and pp must be >= 1, got tp={tp} pp={pp}")
    if not 0 < port < 65536:
        raise BouteError(f"port must be in 1..65535, got {port}")
    argv = [o.python, "-m", "sglang.launch_server", "--model-path", model_path, "--host", o.host, "--port", str(port)]
    argv += ["--tp-size", str(tp), "--pp-size", str(pp), "--mem-fraction-static", f"{o.mem_fraction_static:g}"]
    if o.chunked_prefill_size is not None:
        argv += ["--chunked-prefill-size", str(o.chunked_prefill_size)]
    if o.context_length is not None:
        argv += ["--context-length", str(o.context_length)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    if o.enable_cache_report:
        argv.append("--enable-cache-report")  # a bare flag: it takes no value
    if dtype == "fp8":
        argv += ["--quantization", "fp8"]
    elif dtype != "bf16":
        raise BouteError(f"dtype must be bf16 or fp8, got '{dtype}'")
    return argv + list(o.extra_args)


def argv_flags(args: Sequence[str]) -> dict[str, str | bool]:
    """The flags of a launch command (the part after ``-m sglang.launch_server``) read back: ``{flag: value}``,
    ``True`` for a bare flag. Raises BouteError on a token that is neither a flag nor its value (a bare flag
    missing from :data:`BARE_FLAGS` would otherwise swallow the next flag as its value)."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        if not flag.startswith("--"):
            raise BouteError(f"argv[{i}] = {flag!r}: expected a flag")
        if flag in BARE_FLAGS:
            out[flag], i = True, i + 1
            continue
        if i + 1 >= len(args) or args[i + 1].startswith("--"):
            raise BouteError(f"{flag} has no value (a bare flag not in BARE_FLAGS?)")
        out[flag], i = args[i + 1], i + 2
    return out


def replica_spec(
    group: ReplicaGroup,
    index: int,
    *,
    model_path: str,
    port: int,
    gpu_ids: Sequence[int],
    options: SGLangOptions | None = None,
) -> ProcessSpec:
    """Replica ``index`` of ``group`` on ``gpu_ids`` (exactly tp*pp of them), served as the tier's name."""
    o = options or SGLangOptions()
    if len(gpu_ids) != group.gpus_per_replica:
        raise BouteError(
            f"replica {group.tier}/{index}: needs {group.gpus_per_replica} GPU ids (tp*pp), got {len(gpu_ids)}"
        )
    argv = sglang_argv(
        model_path, port=port, tp=group.tp, pp=group.pp, dtype=group.dtype, served_model_name=group.tier, options=o
    )
    env = {**LIVENESS_ENV, **o.extra_env, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpu_ids)}
    host = "127.0.0.1" if o.host in ("0.0.0.0", "::") else o.host
    return ProcessSpec(
        name=f"{group.tier}-{group.gpu}-{index}",
        argv=tuple(argv),
        env=env,
        health_url=f"http://{host}:{port}/health",
    )


def place_plan(
    plan: Plan,
    gpu_ids: Mapping[str, Sequence[int]],
    *,
    model_paths: Mapping[str, str] | None = None,
    catalog: Catalog | None = None,
    base_port: int = 30000,
    options: SGLangOptions | None = None,
) -> list[ProcessSpec]:
    """Every replica of ``plan`` on one host: contiguous GPU blocks per GPU type, consecutive ports.

    ``gpu_ids`` maps a GPU type to the CUDA ids of that type on this host. ``model_paths`` maps a tier to a
    local checkpoint folder or HF id; a tier without one uses its catalog model's ``hf_id``.
    """
    from boute.catalog import builtin_catalog

    cat = catalog or builtin_catalog()
    paths = dict(model_paths or {})
    free = {k: list(v) for k, v in gpu_ids.items()}
    specs: list[ProcessSpec] = []
    port = base_port
    for gi, group in enumerate(plan.deployment):
        path = paths.get(group.tier) or cat.model(group.model).hf_id
        if not path:
            raise BouteError(f"deployment[{gi}]: no model path for tier '{group.tier}' and no hf_id for {group.model}")
        pool = free.get(group.gpu, [])
        need = group.gpus_used
        if len(pool) < need:
            raise BouteError(
                f"deployment[{gi}] ({group.tier} on {group.gpu}): needs {need} GPUs, "
                f"{len(pool)} of that type left on this host"
            )
        for r in range(group.count):
            ids, pool[:] = pool[: group.gpus_per_replica], pool[group.gpus_per_replica :]
            specs.append(replica_spec(group, r, model_path=path, port=port, gpu_ids=ids, options=options))
            port += 1
    return specs
