"""Run one or many emulated replicas in one process (one event loop, one uvicorn server per port).

Many-in-one keeps ``boute serve --emulate`` cheap for plans with dozens of replicas; tests that kill a
replica start each one as its own process instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from backends.emulated.profile import ReplicaConfig


async def serve_replicas(configs: list[ReplicaConfig], log_level: str = "warning") -> None:
    import uvicorn

    from backends.emulated.app import create_app

    servers = []
    for cfg in configs:
        config = uvicorn.Config(
            create_app(cfg),
            host=cfg.host,
            port=cfg.port,
            loop="uvloop",
            http="httptools",
            log_level=log_level,
            access_log=False,
            backlog=4096,
            timeout_graceful_shutdown=1,
        )
        servers.append(uvicorn.Server(config))
    import gc

    gc.collect()
    gc.freeze()  # start-up objects out of full collections: no tens-of-ms loop stalls (timing fidelity)
    if len(servers) > 1:  # uvicorn installs signal handlers per server; let the first own them
        for s in servers[1:]:
            s.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    await asyncio.gather(*(s.serve() for s in servers))


#: fault injection for experiments: a file listing GPU types (one per line) whose replicas fail to start,
#: as replicas on a lost node would; with a SIGKILL of the running ones it emulates losing a GPU type
DEAD_GPUS_ENV = "BOUTE_EMULATED_DEAD_GPUS"


def _lost_gpus() -> set[str]:
    path = os.environ.get(DEAD_GPUS_ENV)
    if not path or not Path(path).is_file():
        return set()
    return {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backends.emulated", description="emulated SGLang-like backend")
    ap.add_argument("--replicas", type=Path, help="JSON list of replica configs (runs them all)")
    ap.add_argument("--model")
    ap.add_argument("--gpu")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--served-model-name")
    ap.add_argument("--profile", default="builtin:gsm8k")
    ap.add_argument("--profile-model", help="the profile's model column whose responses are replayed")
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--catalog", help="catalog file with the plan's GPUs/models (default: the packaged one)")
    ap.add_argument(
        "--enable-cache-report",
        action="store_true",
        help="SGLang's flag: report prefix-cache hits in usage.prompt_tokens_details.cached_tokens",
    )
    ap.add_argument("--log-level", default="warning")
    a = ap.parse_args(argv)
    if a.replicas is not None:
        configs = [ReplicaConfig.model_validate(c) for c in json.loads(a.replicas.read_text())]
    elif a.model and a.gpu:
        configs = [
            ReplicaConfig(
                model=a.model,
                gpu=a.gpu,
                tp=a.tp,
                pp=a.pp,
                dtype=a.dtype,
                host=a.host,
                port=a.port,
                served_model_name=a.served_model_name,
                profile=a.profile,
                profile_model=a.profile_model,
                speedup=a.speedup,
                catalog=a.catalog,
                enable_cache_report=a.enable_cache_report,
            )
        ]
    else:
        ap.error("give --model and --gpu, or --replicas FILE")
    lost = _lost_gpus()
    for c in configs:
        if c.gpu in lost:  # fault injection: this GPU type is gone, as a crashed node's would be
            print(f"emulated replica: GPU type '{c.gpu}' is lost ({DEAD_GPUS_ENV})", file=sys.stderr)
            return 3
    import uvloop

    uvloop.run(serve_replicas(configs, a.log_level))
    return 0


if __name__ == "__main__":
    sys.exit(main())
