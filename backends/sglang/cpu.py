"""Real SGLang on this CPU: the options its CPU engine needs, and a replica started, measured and stopped.

The server venv and model come from ``make sglang`` (:mod:`backends.sglang.build`). Why each option:

- ``SGLANG_USE_CPU_ENGINE=1``, ``--device cpu``, ``--attention-backend torch_native``: SGLang's CPU path (the
  default backends are CUDA kernels);
- ``--max-total-tokens``: without it SGLang sizes the KV pool from ``--mem-fraction-static`` of *host* memory:
  SmolLM2 on this 24 GB machine got a 607,687-token pool (13 GB of K and V) and the scheduler 15.6 GB of RSS,
  so two replicas could not start. 16,384 tokens (two 8,192-token contexts) keeps a replica near 2 GB.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from backends.sglang.build import read_status, server_dir
from backends.sglang.command import SGLangOptions, sglang_argv
from boute.errors import BouteError

__all__ = [
    "CpuReplica",
    "StreamedChat",
    "cpu_options",
    "server_install",
    "start_cpu_replica",
    "stream_chat",
    "tree_rss_mb",
]

#: KV pool of one CPU replica, tokens (see the module docstring)
DEFAULT_MAX_TOTAL_TOKENS = 16384


def server_install() -> dict[str, object]:
    """The ``make sglang`` install (python, model) or BouteError saying why there is none."""
    status = read_status(server_dir())
    if status is None:
        raise BouteError("the SGLang CPU server is not built: run `make sglang`")
    if not status.get("ok"):
        raise BouteError(f"the SGLang CPU server build failed: {status.get('reason')}")
    return status


def cpu_options(python: str, *, max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS, **kw: object) -> SGLangOptions:
    """SGLangOptions for SGLang's CPU engine run by ``python`` (the server venv's)."""
    if max_total_tokens < 256:
        raise BouteError(f"max_total_tokens must be >= 256, got {max_total_tokens}")
    extra = ("--device", "cpu", "--attention-backend", "torch_native", "--max-total-tokens", str(max_total_tokens))
    base = SGLangOptions(python=python, extra_args=extra, extra_env={"SGLANG_USE_CPU_ENGINE": "1"})
    return replace(base, **kw) if kw else base  # type: ignore[arg-type]


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants (SGLang runs a scheduler and a detokenizer), MB."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total / 2**20


@dataclass
class CpuReplica:
    """One running ``sglang.launch_server`` (its own process group), its URL, log and start-up time."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    ready_s: float

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> None:
        """Signal the whole group (the scheduler and detokenizer children too) and reap it; SIGKILL if needed."""
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout_s)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        finally:
            with contextlib.suppress(ProcessLookupError):  # children left behind a killed parent
                os.killpg(self.proc.pid, signal.SIGKILL)


def start_cpu_replica(
    port: int,
    log: Path,
    *,
    served_model_name: str = "smollm2-135m",
    max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS,
    timeout_s: float = 400.0,
    extra_args: tuple[str, ...] = (),
) -> CpuReplica:
    """Start real SGLang on SmolLM2 and return once ``/health`` answers 200 (or raise with the log's tail)."""
    inst = server_install()
    opts = cpu_options(str(inst["python"]), max_total_tokens=max_total_tokens)
    opts = replace(opts, extra_args=opts.extra_args + extra_args)
    argv = sglang_argv(str(inst["model"]), port=port, served_model_name=served_model_name, options=opts)
    env = {**os.environ, **opts.extra_env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://{opts.host}:{port}"
    replica = CpuReplica(proc, url, log, 0.0)
    while time.monotonic() - started < timeout_s:
        if proc.poll() is not None:
            tail = replica.log_text().strip().splitlines()[-5:]
            raise BouteError(f"sglang exited ({proc.returncode}) before it was ready: {' | '.join(tail)}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                replica.ready_s = time.monotonic() - started
                return replica
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    replica.stop()
    raise BouteError(f"sglang did not answer /health within {timeout_s:.0f} s (log: {log})")


@dataclass
class StreamedChat:
    """One streamed chat completion as the client saw it: time to the first content chunk, the answer, the
    usage chunk, and the exact token ids SGLang prefilled and sampled (its ``sglext`` ids, when asked)."""

    ttft_s: float
    text: str
    usage: dict[str, Any]
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)

    @property
    def cached_tokens(self) -> int:
        """The prefix-cache hit SGLang reported (``--enable-cache-report``); 0 when the usage has none."""
        return int((self.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def stream_chat(url: str, body: dict[str, Any], *, ids: bool = True, timeout_s: float = 300.0) -> StreamedChat:
    """POST ``body`` to ``/v1/chat/completions`` streamed, with the usage chunk and (``ids``) SGLang's token ids.

    TTFT is taken at the first chunk with non-empty ``delta.content`` (the role chunk comes with it, so this is
    when the first answer token arrived), as a client would see it. The ids come from SGLang 0.5.23's
    ``return_input_ids_in_sglext`` / ``return_output_ids_in_sglext``: the prompt exactly as its chat template
    and tokenizer made it, which is what its radix cache is keyed by."""
    extra = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True} if ids else {}
    req = {**body, **extra, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    usage: dict[str, Any] = {}
    input_ids: list[int] = []
    output_ids: list[int] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=req, timeout=timeout_s) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            content = (chunk["choices"][0].get("delta") or {}).get("content") if chunk.get("choices") else None
            if content:
                first = first if first is not None else time.perf_counter()
                parts.append(content)
            usage = chunk.get("usage") or usage
            ext = chunk.get("sglext") or {}
            input_ids = list(ext.get("input_ids") or input_ids)
            output_ids = list((ext.get("output_ids") or [output_ids])[0])
    if first is None:
        raise BouteError(f"no content chunk from {url} (usage {usage})")
    return StreamedChat(first - t0, "".join(parts), usage, input_ids, output_ids)
