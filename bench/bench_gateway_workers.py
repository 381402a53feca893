"""The gateway on more than one core: req/s by worker count, and against the Rust gateways at equal cores.

Issue 50 item 4: ``boute serve --workers N`` runs N gateway processes on one port (SO_REUSEPORT; state shared
through Redis). Goals: req/s scales from 1 to 2 workers with the backends on a separate core budget; at equal
cores, at least the req/s of smg 1.13 and sglang-router 0.3.2 with the plan's learned routing in BOute's path;
overhead p50/p99 beside LiteLLM's published 2 / 8 / 13 ms (p50 / p95 / p99 at 1,170 RPS on 4 instances).

Setup, and why:

- **Core budgets** (``layout``): the proxies get the last ``max(WORKER_COUNTS)`` CPUs, and a proxy measured at
  c cores is pinned (sched_setaffinity at spawn: every thread and child inherits it) to the last c of them;
  wrk, the open-loop client, Redis and the emulated backends share the other CPUs. ``BOUTE_BENCH_PROXY_CPUS``
  / ``BOUTE_BENCH_LOAD_CPUS`` (comma lists) set them. On a host with fewer than ``max + 1`` CPUs the largest
  budget overlaps the load side: the results say so (``overlaps_load``), and its req/s is then bounded by the
  backends and wrk as much as by the gateway.
- **Backends**: the two tiers of the wrk bench's plan (llama-3.1-8b, llama-3.1-70b on H100) with
  ``replicas_per_tier`` emulated replicas each (``BOUTE_BENCH_REPLICAS_PER_TIER``; default: as many as half the
  load CPUs, at least 1, at most 4), one process each, at speedup 1000 with 4-token answers: enough backend
  capacity that the gateways, not the replicas, set req/s. Every replica serves the model name ``boute``, so
  smg (which routes by model name) balances over all of them as sglang-router does; BOute rewrites ``model``
  per replica anyway.
- **Targets**: ``direct`` (wrk at one replica: one backend process's ceiling), ``boute_w{n}`` (``python -m router
  --workers n`` on n cores, the learned router scoring every prompt, fractions 0.5 / 0.5; ``boute_w{n}_affinity``
  the same with prefix affinity on, ``BOUTE_AFFINITY=1``, for its added CPU per request), ``smg_c{n}`` and
  ``sglang_router_c{n}`` (``--policy round_robin``, n cores), for n in ``WORKER_COUNTS``. The Rust gateways run
  from their own virtualenv (``BOUTE_BENCH_RUST_PYTHON``, default ``~/.cache/boute/bench/rustgw/bin/python``;
  a target whose package is missing there is skipped and named in ``skipped``).
- **Throughput**: wrk (1 thread, 64 connections, GSM8K prompts drawn per request: ``bench.gateway_wrk_load``),
  the same command line for every target, in interleaved rounds (every target once per round); per round and
  target req/s, wrk's latency percentiles, and the proxy's CPU per request (all its processes: supervisor and
  workers). Ratios are medians of per-round ratios: ``boute_w2`` over ``boute_w1`` (scaling), and BOute over
  each Rust gateway at the same cores.
- **Overhead**: an open-loop client (``bench.gateway_load --rate``) offers ``RATE`` req/s (LiteLLM's 1,170)
  to every target in turn, in interleaved rounds; latency percentiles of each, and overhead = a proxy's
  percentile minus ``direct``'s in the same round (the extra hop as a client sees it), beside BOute's own
  ``x-boute-overhead-ms`` (its handler's time minus upstream waiting). ``send_lag_p99_ms`` shows the client held
  the rate.

``BOUTE_BENCH_WORKERS_TARGETS`` (comma list) runs only the named targets, ``BOUTE_BENCH_WORKER_COUNTS`` (comma
list, default ``1,2``) the worker counts (``1`` alone on a 2-core host: the proxy on one core, the load on the other); ``BOUTE_BENCH_WORKERS_ROUNDS`` /
``_SECONDS`` override the throughput rounds, ``BOUTE_BENCH_WORKERS_RATE`` and ``_OVERHEAD_SECONDS`` the overhead
phase's offered rate and length.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from bench.bench_gateway import _cpu_s, _pin
from bench.gateway_wrk_load import CONNECTIONS, LUA, MAX_TOKENS, loadavg, write_bodies, wrk
from bench.gateway_wrk_plans import copy_router, learned_router, plan_dict
from bench.gateway_wrk_proxies import process_tree, start_gateway, start_rust_gateway, stop_proxy
from tests.stack import Stack

SPEEDUP = 1000.0
WORKER_COUNTS = tuple(int(n) for n in os.environ.get("BOUTE_BENCH_WORKER_COUNTS", "1,2").split(","))
RUST = {"smg": "smg.launch_router", "sglang_router": "sglang_router.launch_router"}
RUST_PYTHON = Path.home() / ".cache" / "boute" / "bench" / "rustgw" / "bin" / "python"
RATE = 1170.0
LITELLM = {
    "p50_ms": 2,
    "p95_ms": 8,
    "p99_ms": 13,
    "at_rps": 1170,
    "instances": 4,
    "source": "LiteLLM docs, 'Benchmarks' (proxy overhead: median / p95 / p99 latency added)",
}
GOALS = {
    "scaling": "boute_w2 req/s > boute_w1 req/s (backends on a separate core budget)",
    "vs_rust": "boute_w{n} req/s >= smg_c{n} and sglang_router_c{n} at equal cores",
    "overhead": "beside LiteLLM's 2 / 8 / 13 ms p50 / p95 / p99",
}


class Layout(NamedTuple):
    proxy: list[int]  # the largest proxy budget; the c-core budget is its last c CPUs
    load: list[int]  # wrk, the open-loop client, Redis, the backends

    def budget(self, cores: int) -> set[int]:
        return set(self.proxy[len(self.proxy) - cores :])

    def overlaps(self, cores: int) -> bool:
        return bool(self.budget(cores) & set(self.load))


def _cpu_list(name: str) -> list[int] | None:
    raw = os.environ.get(name, "").strip()
    return [int(c) for c in raw.split(",") if c.strip()] if raw else None


def layout() -> Layout:
    cpus = sorted(os.sched_getaffinity(0))
    need = max(WORKER_COUNTS)
    proxy = _cpu_list("BOUTE_BENCH_PROXY_CPUS") or cpus[-need:]
    load = _cpu_list("BOUTE_BENCH_LOAD_CPUS") or ([c for c in cpus if c not in proxy] or cpus[:1])
    if len(proxy) < need:
        raise SystemExit(f"BOUTE_BENCH_PROXY_CPUS: {need} CPUs needed for {need} workers, got {proxy}")
    return Layout(proxy, load)


def replicas_per_tier(lay: Layout) -> int:
    raw = os.environ.get("BOUTE_BENCH_REPLICAS_PER_TIER")
    return int(raw) if raw else max(1, min(4, len(lay.load) // 2))


def start_backends(router: Path, per_tier: int, lay: Layout) -> Stack:
    """The plan's replicas, ``per_tier`` a tier, one process each on the load CPUs, all serving ``boute``."""
    from backends.emulated.launch import registry, replica_configs, spawn_replicas, wait_http
    from boute.specs import load_scenario
    from boute.specs.plan import Plan

    raw = plan_dict(router)
    for g in raw["deployment"]:
        g["count"] = per_tier
    plan = Plan.model_validate(raw)
    work = Path(tempfile.mkdtemp(prefix="boute-workers-bench-"))
    configs = [
        c.model_copy(update={"served_model_name": "boute"}) for c in replica_configs(plan, load_scenario(None), SPEEDUP)
    ]
    st = Stack(plan, work, SPEEDUP)
    st.replicas = spawn_replicas(configs, work, one_process=False)
    st.backend_urls = [f"http://{c.host}:{c.port}" for c in configs]
    st.plan_file = work / "plan.json"
    st.plan_file.write_text(plan.model_dump_json(exclude_none=True))
    st.backends_file = work / "backends.json"
    st.backends_file.write_text(json.dumps(registry(plan, configs)))
    copy_router(router, work)
    for p in st.replicas:
        _pin(p.pid, set(lay.load))
    for u in st.backend_urls:
        wait_http(u + "/health", 120, st.replicas)
    return st


class Target(NamedTuple):
    url: str
    proc: subprocess.Popen[bytes] | None
    cores: int | None


def wanted() -> frozenset[str] | None:
    raw = os.environ.get("BOUTE_BENCH_WORKERS_TARGETS", "").strip()
    return frozenset(n.strip() for n in raw.split(",") if n.strip()) or None


def start_targets(
    st: Stack, lay: Layout, redis_url: str, only: frozenset[str] | None
) -> tuple[dict[str, Target], dict[str, str]]:
    """Every target's process (started once, measured in turn); and those skipped, with the reason."""
    targets: dict[str, Target] = {}
    skipped: dict[str, str] = {}
    if only is None or "direct" in only:
        targets["direct"] = Target(st.backend_urls[0], None, None)
    rust_py = os.environ.get("BOUTE_BENCH_RUST_PYTHON", str(RUST_PYTHON))
    for n in WORKER_COUNTS:
        name = f"boute_w{n}"
        if only is None or name in only:
            env = {"BOUTE_REDIS_URL": redis_url, "BOUTE_REDIS_PREFIX": f"bench-{uuid.uuid4().hex}"}
            url, proc = start_gateway(st, lay.budget(n), workers=n, **env)
            targets[name] = Target(url, proc, n)
        if only is None or f"{name}_affinity" in only:  # prefix affinity on: its added CPU per request
            env = {
                "BOUTE_REDIS_URL": redis_url,
                "BOUTE_REDIS_PREFIX": f"bench-{uuid.uuid4().hex}",
                "BOUTE_AFFINITY": "1",
            }
            url, proc = start_gateway(st, lay.budget(n), workers=n, **env)
            targets[f"{name}_affinity"] = Target(url, proc, n)
        for kind, module in RUST.items():
            name = f"{kind}_c{n}"
            if only is not None and name not in only:
                continue
            found = subprocess.run([rust_py, "-c", f"import {module.split('.')[0]}"], capture_output=True)
            if found.returncode != 0:
                skipped[name] = f"{module.split('.')[0]} not importable by {rust_py}"
                continue
            url, proc = start_rust_gateway(module, rust_py, st.backend_urls, lay.budget(n))
            targets[name] = Target(url, proc, n)
    return targets, skipped


def _tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for p in pids:
        with contextlib.suppress(OSError):
            total += _cpu_s(p)
    return total


def throughput_round(
    targets: dict[str, Target], st: Stack, script: Path, bodies: Path, seconds: float, lay: Layout, seed: int
) -> dict[str, Any]:
    """One wrk run per target; the proxy's CPU (all its processes) and the backends' per request."""
    row: dict[str, Any] = {}
    backends = [p.pid for p in st.replicas]
    for name, t in targets.items():
        proxy = process_tree(t.proc.pid) if t.proc is not None else []
        cpu0 = (_tree_cpu(proxy), _tree_cpu(backends))
        r = wrk(t.url, script, bodies, seconds, {}, set(lay.load), seed=seed)
        n = max(1, r["requests"])
        dur = r["requests"] / r["req_per_s"] if r["req_per_s"] else seconds
        for key, pids, c0 in (("proxy", proxy, cpu0[0]), ("backend", backends, cpu0[1])):
            if pids:
                used = _tree_cpu(pids) - c0
                r[f"{key}_cpu_us_per_req"] = round(used / n * 1e6, 1)
                r[f"{key}_cpu_pct"] = round(100 * used / dur, 1)  # of one core
        row[name] = r
    return row


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3) if values else float("nan")


def overhead_round(targets: dict[str, Target], bodies: Path, seconds: float, rate: float, lay: Layout) -> dict:
    """Each target at ``rate`` req/s, open loop: latency percentiles of its 200s, its send lag, BOute's header."""
    from bench.gateway_wrk_load import open_loop

    row: dict[str, Any] = {}
    for name, t in targets.items():
        out = open_loop(t.url, rate, seconds, 10.0, bodies, set(lay.load))
        ok = [lat * 1e3 for lat, code in zip(out["lat_s"], out["status"], strict=True) if code == 200]
        row[name] = {
            "sent": out["sent"],
            "ok": len(ok),
            "failed": out["sent"] - len(ok),
            "send_lag_p99_ms": round(out["send_lag_p99_ms"], 3),
            **{f"latency_p{q}_ms": _pct(ok, q) for q in (50, 95, 99)},
            **{f"header_overhead_p{q}_ms": _pct(out["overhead_ms"], q) for q in (50, 95, 99) if out["overhead_ms"]},
        }
    return row


def _median(rows: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return round(float(np.median(vals)), 3) if vals else float("nan")


def _ratio(rounds: list[dict[str, Any]], a: str, b: str, key: str = "req_per_s") -> dict[str, Any] | None:
    if not rounds or a not in rounds[0] or b not in rounds[0]:
        return None
    per = [r[a][key] / r[b][key] for r in rounds if r[b][key]]
    return {"median_of_rounds": round(float(np.median(per)), 3), "per_round": [round(x, 3) for x in per]}


def summarise(thr: list[dict[str, Any]], ovh: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(thr[0]) if thr else []
    keys = ("req_per_s", "latency_p50_ms", "latency_p99_ms", "proxy_cpu_us_per_req", "proxy_cpu_pct")
    out: dict[str, Any] = {"throughput": {}, "ratios": {}, "overhead": {}}
    for name in names:
        rows = [r[name] for r in thr]
        out["throughput"][name] = {k: _median(rows, k) for k in (*keys, "backend_cpu_pct") if any(k in r for r in rows)}
        out["throughput"][name]["non_2xx"] = sum(r["non_2xx"] for r in rows)
        out["throughput"][name]["errors"] = sum(r["errors"] for r in rows)
    ratios = {"boute_w2_vs_boute_w1": _ratio(thr, "boute_w2", "boute_w1")}
    for n in WORKER_COUNTS:
        ratios[f"boute_w{n}_affinity_vs_boute_w{n}"] = _ratio(thr, f"boute_w{n}_affinity", f"boute_w{n}")
        ratios[f"boute_w{n}_affinity_cpu_vs_boute_w{n}"] = _ratio(
            thr, f"boute_w{n}_affinity", f"boute_w{n}", "proxy_cpu_us_per_req"
        )
        for kind in RUST:
            ratios[f"boute_w{n}_vs_{kind}_c{n}"] = _ratio(thr, f"boute_w{n}", f"{kind}_c{n}")
    out["ratios"] = {k: v for k, v in ratios.items() if v is not None}
    for name in list(ovh[0]) if ovh else []:
        rows = [r[name] for r in ovh]
        o = {k: _median(rows, k) for k in rows[0] if k.endswith("_ms")}
        if name != "direct" and "direct" in ovh[0]:
            for q in (50, 95, 99):
                added = [r[name][f"latency_p{q}_ms"] - r["direct"][f"latency_p{q}_ms"] for r in ovh]
                o[f"added_p{q}_ms"] = round(float(np.median(added)), 3)
        o["failed"] = sum(r["failed"] for r in rows)
        out["overhead"][name] = o
    return out


def run(quick: bool = True) -> dict[str, Any]:
    from tests.services import free_port, start_redis

    lay = layout()
    rounds_n, seconds = (2, 5.0) if quick else (5, 20.0)
    rounds_n = int(os.environ.get("BOUTE_BENCH_WORKERS_ROUNDS", rounds_n))
    seconds = float(os.environ.get("BOUTE_BENCH_WORKERS_SECONDS", seconds))
    o_rounds, o_seconds = (1, 5.0) if quick else (3, 20.0)
    o_seconds = float(os.environ.get("BOUTE_BENCH_WORKERS_OVERHEAD_SECONDS", o_seconds))
    rate = float(os.environ.get("BOUTE_BENCH_WORKERS_RATE", RATE))
    router, per_tier = learned_router(), replicas_per_tier(lay)
    work = Path(tempfile.mkdtemp(prefix="boute-workers-"))
    load_before = loadavg()
    redis_port = free_port()
    redis = start_redis(redis_port, str(work))
    _pin(redis.pid, set(lay.load))
    st = start_backends(router, per_tier, lay)
    targets: dict[str, Target] = {}
    try:
        targets, skipped = start_targets(st, lay, f"redis://127.0.0.1:{redis_port}/0", wanted())
        script, bodies = work / "prompts.lua", work / "bodies.jsonl"
        script.write_text(LUA)
        n_prompts = write_bodies(bodies)
        for t in targets.values():  # warm-up: connections opened, lazy imports and caches filled
            wrk(t.url, script, bodies, 2, {}, set(lay.load))
        thr = [throughput_round(targets, st, script, bodies, seconds, lay, i) for i in range(rounds_n)]
        ovh = [overhead_round(targets, bodies, o_seconds, rate, lay) for _ in range(o_rounds)]
    finally:
        for t in targets.values():
            if t.proc is not None:
                stop_proxy(t.proc)
        st.stop()
        redis.terminate()
        redis.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    setup = {
        "proxy_cpus": lay.proxy,
        "load_cpus": lay.load,
        "budgets": {n: sorted(lay.budget(n)) for n in WORKER_COUNTS},
        "overlaps_load": {n: lay.overlaps(n) for n in WORKER_COUNTS},
        "replicas_per_tier": per_tier,
        "speedup": SPEEDUP,
        "max_tokens": MAX_TOKENS,
        "prompts": n_prompts,
        "wrk": f"wrk -t1 -c{CONNECTIONS} -d{seconds:g}s --timeout 10s -s prompts.lua URL -- bodies.jsonl ROUND",
        "rounds": rounds_n,
        "overhead_rate_rps": rate,
        "overhead_rounds": o_rounds,
        "overhead_seconds": o_seconds,
        "targets": list(targets),
        "skipped": skipped,
    }
    host = {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": loadavg()}
    return {
        "goals": GOALS,
        "litellm_published": LITELLM,
        "setup": setup,
        "summary": summarise(thr, ovh),
        "throughput_rounds": thr,
        "overhead_rounds": ovh,
        "host": host,
    }


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        print(json.dumps(run(quick="--full" not in sys.argv), indent=2))
