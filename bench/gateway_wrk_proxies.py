"""The proxies under test in ``bench_gateway_wrk``: BOute gateway processes and sglang-router, started on the
bench stack's replicas (optionally pinned to one CPU), stopped, and a cascade gateway's judged counts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from bench.gateway_wrk_load import affinity
from tests.stack import Stack, free_port, wait_http


def stop_proxy(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def start_gateway(
    stack: Stack, cpus: set[int] | None, tree: str | None = None, workers: int = 1, **env: str
) -> tuple[str, subprocess.Popen[bytes]]:
    """A BOute gateway process on the stack's plan/registry (``tree``: run another checkout's ``router/``;
    ``workers`` > 1: a supervisor and that many worker processes on the port, which needs BOUTE_REDIS_URL in
    ``env``; all of them on ``cpus``)."""
    port = free_port()
    full_env = {
        **os.environ,
        "BOUTE_PLAN": str(stack.plan_file),
        "BOUTE_BACKENDS": str(stack.backends_file),
        **env,
    }
    log = open(stack.workdir / f"gateway-{port}.log", "wb")  # noqa: SIM115 - lives as long as the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "router", "--port", str(port), *(["--workers", str(workers)] if workers > 1 else [])],
        env=full_env,
        cwd=tree,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=affinity(cpus),
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/ready", 120, [proc])
    return url, proc


def start_sglang_router(workers: list[str], cpus: set[int] | None) -> tuple[str, subprocess.Popen[bytes]] | None:
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        return None
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers, "--port", str(port)]
    cmd += ["--policy", "round_robin", "--log-level", "error"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=affinity(cpus))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 60, [proc])
    return url, proc


def start_rust_gateway(
    module: str, python: str, workers: list[str], cpus: set[int] | None
) -> tuple[str, subprocess.Popen[bytes]]:
    """A Rust gateway (``smg.launch_router`` or ``sglang_router.launch_router``, run by ``python``: its own
    virtualenv), ``round_robin`` over ``workers``, on ``cpus`` (its runtime sizes its threads to them)."""
    port, metrics_port = free_port(), free_port()  # each its own metrics port (both default to 29000)
    cmd = [python, "-m", module, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers]
    cmd += ["--policy", "round_robin", "--log-level", "error"]
    cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=affinity(cpus))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 60, [proc])
    return url, proc


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a gateway's supervisor and workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as fh:
                todo += [int(c) for c in fh.read().split()]
        except OSError:
            continue
    return out


def pinning() -> tuple[set[int], set[int]] | None:
    """(proxy CPUs, everything else's CPUs), or None when not pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    if os.environ.get("BOUTE_BENCH_PIN", "1") == "0" or len(cpus) < 2:
        return None
    return {cpus[-1]}, set(cpus[:-1])


def judged_counts(url: str) -> tuple[float, float]:
    """(requests answered, escalations) so far, from a gateway's /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    requests = escalations = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "boute_requests_total":
                requests += sample.value
            elif sample.name == "boute_escalations_total":
                escalations += sample.value
    return requests, escalations
