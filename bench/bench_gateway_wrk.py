"""Gateway req/s and CPU per request with the learned router in the path, against sglang-router, under wrk.

Issue 11: BOute's gateway (learned router scoring every prompt) should serve >= 0.9x the requests/s of
sglang-router (the Rust load balancer, ``round_robin``) in front of the same emulated backends.

Setup, and why:

- **Backends**: the two replicas of a two-tier plan (llama-3.1-8b and llama-3.1-70b on H100s), emulated in one
  process at speedup ``SPEEDUP`` with 4-token answers, so a request costs the backend little CPU and no modelled
  wait worth the name: the proxies, not the backend, should limit req/s. ``direct`` rows (wrk straight at one
  replica, same bodies) show the backend side's own ceiling on this host.
- **Traffic**: wrk (C, one thread, ``CONNECTIONS`` keep-alive connections) with a Lua script that sends chat
  completions whose user message is drawn at random per request from the GSM8K profile's 1319 prompts
  (``max_tokens`` 4, model ``boute``): varied prompts, so the learned router scores a different prompt each
  time. Both proxies get byte-identical requests.
- **BOute**: one gateway process (``python -m router``) with a plan whose ``routing.scorer`` is ``learned`` (a
  static-embedding router trained by ``boute router train --profile builtin:gsm8k``, cached under
  ``$BOUTE_CACHE_DIR/bench/gateway_wrk``), fractions 0.5/0.5, so every request is scored and about half go to
  each tier. ``boute_length``: a second gateway with the same plan on ``routing.scorer: length`` (~1 µs per
  prompt), i.e. the proxy's own cost without a model.
- **sglang-router** 0.3.2, ``--policy round_robin`` over the same two replicas.
- **Fairness / pinning**: with 2+ CPUs, every proxy under test is pinned to the last CPU and wrk + backends to
  the others (sched_setaffinity at spawn, so every thread inherits it; sglang-router's runtime therefore sizes
  itself to one CPU, like BOute's single event loop). Each proxy thus has one core at most, and only one proxy
  is loaded at a time (the idle ones sleep). The host's other tenants are not pinned and take from every core.
  ``BOUTE_BENCH_PIN=0`` turns pinning off.
- **Rounds** are interleaved (direct, BOute, BOute-length, sglang-router, direct, BOute, ...), each ``seconds``
  long after a warm-up, and the host's load average is recorded around each, because this host is shared and
  noisy. Per round and proxy: req/s, latency percentiles (wrk's), and CPU µs per request of the proxy process
  (user + system from /proc, all threads, divided by the requests wrk completed): the robust figure, since
  it does not depend on how much CPU other tenants leave. Ratios are medians of per-round ratios.
- **Overload** (``overload``): the same learned plan with a tier capacity set low
  (``BOUTE_TIER_QUEUE_PER_REPLICA=8``, two replicas) and backends at speedup 1 (16-token answers: ~0.15-0.5 s
  a request). Capacity is the rate of 200s while those bounds are saturated; then an open-loop generator
  (``bench.gateway_load --rate``, GSM8K prompts) offers 3x that rate with a 10 s client timeout: share of 429s,
  latency of the 429 and 200 answers, and requests that hit the client timeout (should be none).

- **Cascade** (``boute_cascade``, issue 29): a gateway on the same two replicas with a cascade plan judged by
  the bundled static verifier (``routing.judge: verifier``), the verifier the optimiser trains for the
  scenario's quality model, bundled by :func:`boute.serving.bundle.write_plan` as ``boute optimize --mode
  cascade`` bundles it. Its threshold is the median of the verifier's scores on the answers tier 0 actually
  gives these prompts (4-token answers), so every request is judged once and about half go to both tiers;
  each round records the share escalated (from the gateway's /metrics). Compared with ``boute`` (pre-routed,
  learned router) in the same rounds (``boute_cascade_vs_boute``).

``BOUTE_BENCH_WRK_TARGETS=boute,boute_cascade`` runs only the named targets (of ``direct``, ``boute``,
``boute_length``, ``boute_cascade``, ``boute_base``, ``sglang_router``) and no overload phase; the figures go
under ``results.targets_run`` of ``bench/results/gateway_wrk.json``, beside the previous full run's, which
are kept (a partial run must not erase the sglang-router comparison).
``BOUTE_BENCH_BASE_TREE=DIR`` runs the BOute gateway from another checkout's ``router/`` (``DIR/router``) as an
extra target ``boute_base``, for before/after comparisons in the same interleaved rounds;
``BOUTE_BENCH_WRK_ROUNDS`` / ``BOUTE_BENCH_WRK_SECONDS`` override the number and length of rounds.

This module runs the rounds and summarises them; the plans served are in ``bench.gateway_wrk_plans``, the load
generators in ``bench.gateway_wrk_load``, the proxies' processes in ``bench.gateway_wrk_proxies`` and the
overload phase in ``bench.gateway_wrk_overload`` (none named ``bench_*``: ``python -m bench`` runs only those).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_gateway import _pin
from bench.gateway_wrk_load import CONNECTIONS, LUA, MAX_TOKENS, loadavg, write_bodies, wrk
from bench.gateway_wrk_overload import overload
from bench.gateway_wrk_plans import copy_router, learned_router, length_plan_dict, plan_dict, write_cascade_plan
from bench.gateway_wrk_proxies import judged_counts, pinning, start_gateway, start_sglang_router, stop_proxy
from tests.stack import Stack

SPEEDUP = 1000.0
GOAL = ">= 0.9x sglang-router req/s"
#: the throughput targets, in round order
TARGETS = ("direct", "boute", "boute_length", "boute_cascade", "boute_base", "sglang_router")
RESULT = Path(__file__).parent / "results" / "gateway_wrk.json"


def wanted_targets() -> frozenset[str] | None:
    """The targets ``BOUTE_BENCH_WRK_TARGETS`` names (comma-separated), None when unset (all of them)."""
    raw = os.environ.get("BOUTE_BENCH_WRK_TARGETS", "").strip()
    if not raw:
        return None
    names = frozenset(n.strip() for n in raw.split(",") if n.strip())
    unknown = names - set(TARGETS)
    if unknown:
        raise SystemExit(f"BOUTE_BENCH_WRK_TARGETS: unknown target(s) {sorted(unknown)} (known: {', '.join(TARGETS)})")
    return names


def _median(rows: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return round(float(np.median(vals)), 1) if vals else float("nan")


def throughput(
    quick: bool, router: Path, work: Path, pin: tuple[set[int], set[int]] | None, only: frozenset[str] | None = None
) -> dict[str, Any]:
    """Interleaved wrk rounds: direct (backend ceiling), BOute pre-routed (learned, length), BOute cascade,
    sglang-router (and boute_base if asked); ``only``: just those targets."""
    rounds_n, seconds = (3, 10.0) if quick else (6, 20.0)
    rounds_n = int(os.environ.get("BOUTE_BENCH_WRK_ROUNDS", rounds_n))
    seconds = float(os.environ.get("BOUTE_BENCH_WRK_SECONDS", seconds))
    stack = Stack.start(plan_dict(router), speedup=SPEEDUP, one_process=True)
    copy_router(router, stack.workdir)
    procs: list[subprocess.Popen[bytes]] = []
    proxy_cpus, other_cpus = pin if pin else (None, None)

    def want(name: str) -> bool:
        return only is None or name in only

    def gateway(name: str, **env: str) -> None:
        url, proc = start_gateway(stack, proxy_cpus, **env)
        procs.append(proc)
        targets[name] = (url, proc.pid)

    threshold: float | None = None
    try:
        backend = stack.replicas[0].pid
        if other_cpus:
            _pin(backend, other_cpus)
        targets: dict[str, tuple[str, int | None]] = {}
        if want("direct"):
            targets["direct"] = (stack.backend_urls[0], None)
        if want("boute"):
            gateway("boute")
        if want("boute_length"):
            # the same gateway with the length scorer (~1 µs per prompt): the proxy's own cost, without scoring
            length_plan = stack.workdir / "plan_length.json"
            length_plan.write_text(json.dumps(length_plan_dict()))
            gateway("boute_length", BOUTE_PLAN=str(length_plan))
        if want("boute_cascade"):
            cascade_plan = stack.workdir / "plan_cascade.json"
            threshold = write_cascade_plan(stack, cascade_plan)
            gateway("boute_cascade", BOUTE_PLAN=str(cascade_plan))
        base = os.environ.get("BOUTE_BENCH_BASE_TREE")
        if base and want("boute_base"):
            url, gwb = start_gateway(stack, proxy_cpus, tree=base)
            procs.append(gwb)
            targets["boute_base"] = (url, gwb.pid)
        sgr = start_sglang_router(stack.backend_urls, proxy_cpus) if want("sglang_router") else None
        if sgr is not None:
            procs.append(sgr[1])
            targets["sglang_router"] = (sgr[0], sgr[1].pid)
        script, bodies = work / "prompts.lua", work / "bodies.jsonl"
        script.write_text(LUA)
        n_prompts = write_bodies(bodies)
        for u, _ in targets.values():  # warm-up: connections opened, lazy imports and caches filled
            wrk(u, script, bodies, 2, {}, other_cpus)
        rounds: list[dict[str, Any]] = []
        for i in range(rounds_n):
            row: dict[str, Any] = {}
            for name, (u, pid) in targets.items():
                watch = {"backend": backend, **({"proxy": pid} if pid else {})}
                judged = judged_counts(u) if name == "boute_cascade" else None
                row[name] = wrk(u, script, bodies, seconds, watch, other_cpus, seed=i)
                if judged is not None:
                    answered, escalated = (b - a for a, b in zip(judged, judged_counts(u), strict=True))
                    row[name]["escalated_share"] = round(escalated / max(1.0, answered), 3)
            rounds.append(row)
        summary: dict[str, Any] = {}
        for name in targets:
            rows = [r[name] for r in rounds]
            summary[name] = {
                k: _median(rows, k)
                for k in (
                    "req_per_s",
                    "latency_p50_ms",
                    "latency_p99_ms",
                    "proxy_cpu_us_per_req",
                    "proxy_cpu_pct",
                    "backend_cpu_us_per_req",
                    "backend_cpu_pct",
                    "wrk_cpu_us_per_req",
                )
                if any(k in r for r in rows)
            }
            if name == "boute_cascade":
                summary[name]["escalated_share"] = round(float(np.median([r["escalated_share"] for r in rows])), 3)
            summary[name]["non_2xx"] = sum(r["non_2xx"] for r in rows)
            summary[name]["errors"] = sum(r["errors"] for r in rows)
        if "sglang_router" in summary:
            s = summary["sglang_router"]
            for name in ("boute", "boute_length", "boute_base"):
                if name in summary:
                    b = summary[name]
                    per_round = [r[name]["req_per_s"] / r["sglang_router"]["req_per_s"] for r in rounds]
                    summary[f"{name}_vs_sglang_router"] = {
                        "req_per_s_ratio_median_of_rounds": round(float(np.median(per_round)), 3),
                        "req_per_s_ratio_per_round": [round(x, 3) for x in per_round],
                        "cpu_per_req_ratio": round(b["proxy_cpu_us_per_req"] / s["proxy_cpu_us_per_req"], 3),
                        # what one fully used core would serve at the measured CPU cost per request
                        "req_per_s_per_core": round(1e6 / b["proxy_cpu_us_per_req"], 1),
                        "sglang_router_req_per_s_per_core": round(1e6 / s["proxy_cpu_us_per_req"], 1),
                    }
        if "boute" in summary and "boute_cascade" in summary:
            summary["boute_cascade_vs_boute"] = cascade_vs_preroute(rounds, summary)
        return {
            "setup": {
                "backends": "emulated llama-3.1-8b + llama-3.1-70b (H100), one process",
                "speedup": SPEEDUP,
                "max_tokens": MAX_TOKENS,
                "prompts": n_prompts,
                "connections": CONNECTIONS,
                "seconds_per_run": seconds,
                "rounds": rounds_n,
                "proxy_cpus": sorted(proxy_cpus) if proxy_cpus else None,
                "wrk_and_backend_cpus": sorted(other_cpus) if other_cpus else None,
                "targets": list(targets),
                "cascade_threshold": threshold,
            },
            "rounds": rounds,
            "summary": summary,
        }
    finally:
        for p in procs:
            stop_proxy(p)
        stack.stop()


def cascade_vs_preroute(rounds: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    """The cascade gateway against the pre-routed one, measured in the same rounds: per-round req/s ratios
    (the host's load changes between rounds, less within one), and what judging costs in CPU per request."""
    c, p = summary["boute_cascade"], summary["boute"]
    per_round = [r["boute_cascade"]["req_per_s"] / r["boute"]["req_per_s"] for r in rounds]
    return {
        "req_per_s_ratio_median_of_rounds": round(float(np.median(per_round)), 3),
        "req_per_s_ratio_per_round": [round(x, 3) for x in per_round],
        "proxy_cpu_us_per_req": {"preroute": p["proxy_cpu_us_per_req"], "cascade": c["proxy_cpu_us_per_req"]},
        "cascade_extra_cpu_us_per_req": round(c["proxy_cpu_us_per_req"] - p["proxy_cpu_us_per_req"], 1),
        "latency_p50_ms": {"preroute": p["latency_p50_ms"], "cascade": c["latency_p50_ms"]},
        "latency_p99_ms": {"preroute": p["latency_p99_ms"], "cascade": c["latency_p99_ms"]},
        "escalated_share": c["escalated_share"],
    }


def previous_results() -> dict[str, Any]:
    """The last full run's results (``bench/results/gateway_wrk.json``), which a partial run keeps."""
    try:
        saved = json.loads(RESULT.read_text())
    except (OSError, ValueError):
        return {}
    results = saved.get("results", {})
    results.pop("targets_run", None)
    return {**results, "full_run_meta": results.get("full_run_meta", saved.get("meta"))} if results else {}


def run(quick: bool = True) -> dict[str, Any]:
    pin = pinning()
    load_before = loadavg()
    only = wanted_targets()
    router = learned_router()
    work = Path(tempfile.mkdtemp(prefix="boute-wrk-"))
    try:
        results: dict[str, Any] = {"goal": GOAL}
        measured = throughput(quick, router, work, pin, only)
        if only is None:
            results["throughput"] = measured
            results["overload"] = overload(quick, router, work, pin)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    host = {
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "pinned": bool(pin),
        "note": "shared host: other tenants' jobs run on every CPU; cpu_us_per_req is user+system time of that "
        "process over the run divided by the requests wrk completed (robust to how busy the host is, unlike req/s).",
    }
    if only is None:
        return {**results, "host": host}
    # a partial run: its figures beside the last full run's (whose own meta is kept with them)
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("BOUTE_BENCH_")}
    partial = {"targets": sorted(only), "when": datetime.now(UTC).isoformat(timespec="seconds"), "env": env}
    return {**previous_results(), "targets_run": {**partial, "throughput": measured, "host": host}}


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        print(json.dumps(run(quick="--full" not in sys.argv), indent=2))
