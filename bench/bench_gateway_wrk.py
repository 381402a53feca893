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
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_gateway import _cpu_s, _pin
from tests.stack import Stack, free_port, wait_http

SPEEDUP = 1000.0
MAX_TOKENS = 4
CONNECTIONS = 64
GOAL = ">= 0.9x sglang-router req/s"
WRK = shutil.which("wrk") or "/usr/bin/wrk"
#: the throughput targets, in round order
TARGETS = ("direct", "boute", "boute_length", "boute_cascade", "boute_base", "sglang_router")
RESULT = Path(__file__).parent / "results" / "gateway_wrk.json"

#: wrk script: request bodies (one JSON per line, a file named by the first argument after ``--``) are
#: formatted once per thread in ``init``; ``request`` draws one at random; ``done`` prints a JSON summary
LUA = r"""
local reqs, n = {}, 0
function init(args)
  local headers = {["Content-Type"] = "application/json"}
  for line in io.lines(args[1]) do
    n = n + 1
    reqs[n] = wrk.format("POST", "/v1/chat/completions", headers, line)
  end
  math.randomseed(os.time() * 1000 + tonumber(args[2] or "0"))
end
function request()
  return reqs[math.random(n)]
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,"write_errors":%d,' ..
    '"non_2xx":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.max, latency.mean))
end
"""


def plan_dict(router: Path) -> dict[str, Any]:
    """Two tiers, learned scorer, half the GSM8K reference to each: every request is scored. The router's
    files are the plan's artifacts (copied beside the plan by :func:`_copy_router`, hashes checked on load)."""
    from boute.quality.router import load_router
    from boute.specs.io import sha256_file

    files = load_router(router).files()
    plan = plan_dict_base()
    plan["routing"].update(scorer="learned", router=router.name)
    plan["artifacts"] = [{"path": f.name, "sha256": sha256_file(f)} for f in files]
    return plan


def plan_dict_base() -> dict[str, Any]:
    """Two tiers on H100s, half the load each; the scorer is set by the callers."""
    return {
        "scenario": "builtin:paper-gsm8k",
        "routing": {
            "mode": "preroute",
            "tiers": ["small", "large"],
            "fractions": [0.5, 0.5],
            "reference": "builtin:gsm8k",
        },
        "deployment": [
            {"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 1},
            {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4},
        ],
    }


def length_plan_dict() -> dict[str, Any]:
    """The same plan with ``routing.scorer: length`` (prompt-length CDF): the gateway without a model."""
    plan = plan_dict_base()
    plan["routing"].update(scorer="length")
    return plan


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


def cascade_verifier() -> Path:
    """The static verifier the optimiser scores paper-gsm8k cascades with (its quality model's, trained once
    and cached): the file a cascade plan from ``boute optimize --mode cascade`` would bundle."""
    from boute.optimize.evaluators.base import verifier_of
    from boute.quality.build import quality_model_for
    from boute.specs import load_scenario

    model = quality_model_for(load_scenario("builtin:paper-gsm8k"))
    assert model.cascade_scores is not None  # two tiers: a cascade model
    model.cascade_scores()  # trains and saves the verifier unless a cached one is there
    path = verifier_of(model)
    assert path is not None
    return Path(path)


def half_threshold(stack: Stack, verifier: Path, prompts: list[str]) -> float:
    """The verifier score that escalates half of ``prompts``: the median of its scores on the answers tier 0's
    replica gives them (its own responder, at ``MAX_TOKENS``), i.e. the texts the gateway's judge will read."""
    from backends.emulated.launch import replica_configs
    from backends.emulated.profile import Responder
    from boute.quality.judges import load_verifier
    from boute.specs import load_scenario

    small = replica_configs(stack.plan, load_scenario(None))[0]  # the plan lists tier 0's replica first
    responder = Responder(small)
    answers = ["".join(responder.answer(p, MAX_TOKENS)[0]) for p in prompts]
    return float(np.median(load_verifier(verifier).score(prompts, answers)))


def write_cascade_plan(stack: Stack, out: Path) -> float:
    """The bench plan's two replicas as a verifier-judged cascade, bundled beside ``out``; returns its
    threshold (:func:`half_threshold`)."""
    from boute.quality.judges import verifier_files
    from boute.quality.profiles import load_profile
    from boute.serving.bundle import write_plan
    from boute.specs import load_scenario
    from boute.specs.plan import Plan

    verifier = cascade_verifier()
    threshold = half_threshold(stack, verifier, list(load_profile("builtin:gsm8k").prompts))
    plan = plan_dict_base()
    plan["routing"] = {
        "mode": "cascade",
        "tiers": ["small", "large"],
        "fractions": [0.5, 0.5],
        "judge": "verifier",
        "verifier": verifier.name,
        "thresholds": [threshold],
    }
    scenario = load_scenario("builtin:paper-gsm8k")
    write_plan(Plan.model_validate(plan), out, scenario, verifier_files=verifier_files(verifier))
    return threshold


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


def learned_router() -> Path:
    """A static-embedding router trained on builtin:gsm8k, trained once and cached (training distils the
    embedding table on first use: minutes; later: seconds)."""
    from boute.quality.embed import default_cache_dir

    out = default_cache_dir() / "bench" / "gateway_wrk" / "router.npz"
    if not (out.is_file() and Path(str(out) + ".json").is_file()):
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "boute.cli.main",
            "router",
            "train",
            "--profile",
            "builtin:gsm8k",
            "--out",
            str(out),
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def _copy_router(src: Path, dest_dir: Path) -> None:
    """Copy the router's files beside the plan (a plan's router path is relative to its folder)."""
    from boute.quality.router import load_router

    for f in load_router(src).files():
        shutil.copy2(f, dest_dir / f.name)


def write_bodies(path: Path, max_tokens: int = MAX_TOKENS, limit: int | None = None) -> int:
    """Chat bodies, one per line, one per GSM8K prompt (the profile behind boute/data/routellm/gsm8k_*.csv)."""
    import orjson

    from boute.quality.profiles import load_profile

    prompts = list(load_profile("builtin:gsm8k").prompts)[:limit]
    with open(path, "wb") as fh:
        for p in prompts:
            body = {"model": "boute", "messages": [{"role": "user", "content": p}], "max_tokens": max_tokens}
            fh.write(orjson.dumps(body) + b"\n")
    return len(prompts)


def _affinity(cpus: set[int] | None) -> Callable[[], None] | None:
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def _loadavg() -> list[float]:
    with open("/proc/loadavg") as fh:
        return [float(x) for x in fh.read().split()[:3]]


def wrk(
    url: str, script: Path, bodies: Path, seconds: float, watch: dict[str, int], cpus: set[int] | None, seed: int = 0
) -> dict[str, Any]:
    """One wrk run; CPU of the ``watch`` processes (and wrk's own) over it, per completed request."""
    cmd = [WRK, "-t1", f"-c{CONNECTIONS}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(script), url]
    cmd += ["--", str(bodies), str(seed)]
    cpu0 = {k: _cpu_s(p) for k, p in watch.items()}
    load0 = _loadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_affinity(cpus))
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read().decode() if proc.stdout else ""
    cpu = {k: _cpu_s(p) - cpu0[k] for k, p in watch.items()}
    line = next((ln for ln in out.splitlines() if ln.startswith("WRKJSON ")), None)
    if proc.returncode != 0 or line is None:
        err = proc.stderr.read().decode() if proc.stderr else ""
        raise RuntimeError(f"wrk failed ({proc.returncode}): {out[-500:]} {err[-500:]}")
    w = json.loads(line.removeprefix("WRKJSON "))
    n = max(1, w["requests"])
    dur = w["duration_us"] / 1e6
    row: dict[str, Any] = {
        "requests": w["requests"],
        "req_per_s": round(w["requests"] / dur, 1),
        "latency_p50_ms": round(w["p50_us"] / 1e3, 2),
        "latency_p90_ms": round(w["p90_us"] / 1e3, 2),
        "latency_p99_ms": round(w["p99_us"] / 1e3, 2),
        "latency_max_ms": round(w["max_us"] / 1e3, 2),
        "errors": w["connect_errors"] + w["read_errors"] + w["write_errors"] + w["timeouts"],
        "non_2xx": w["non_2xx"],
        "wrk_cpu_us_per_req": round((usage.ru_utime + usage.ru_stime) / n * 1e6, 1),
        "loadavg_1m_before": load0,
        "loadavg_1m_after": _loadavg()[0],
        "wall_s": round(wall, 2),
    }
    for k, c in cpu.items():
        row[f"{k}_cpu_us_per_req"] = round(c / n * 1e6, 1)
        row[f"{k}_cpu_pct"] = round(100 * c / dur, 1)
    return row


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def start_gateway(
    stack: Stack, cpus: set[int] | None, tree: str | None = None, **env: str
) -> tuple[str, subprocess.Popen[bytes]]:
    """A BOute gateway process on the stack's plan/registry (``tree``: run another checkout's ``router/``)."""
    port = free_port()
    full_env = {
        **os.environ,
        "BOUTE_PLAN": str(stack.plan_file),
        "BOUTE_BACKENDS": str(stack.backends_file),
        **env,
    }
    log = open(stack.workdir / f"gateway-{port}.log", "wb")  # noqa: SIM115 - lives as long as the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "router", "--port", str(port)],
        env=full_env,
        cwd=tree,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_affinity(cpus),
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
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_affinity(cpus))
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 60, [proc])
    return url, proc


def _pinning() -> tuple[set[int], set[int]] | None:
    """(proxy CPUs, everything else's CPUs), or None when not pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    if os.environ.get("BOUTE_BENCH_PIN", "1") == "0" or len(cpus) < 2:
        return None
    return {cpus[-1]}, set(cpus[:-1])


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
    _copy_router(router, stack.workdir)
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
            _stop(p)
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


def _open_loop(url: str, rate: float, seconds: float, timeout: float, bodies: Path, cpus: set[int] | None) -> Any:
    tmp = Path(tempfile.mkdtemp(prefix="boute-ol-"))
    out = tmp / "out.json"
    cmd = [sys.executable, "-m", "bench.gateway_load", "--url", url, "--rate", str(rate), "--seconds", str(seconds)]
    cmd += ["--timeout", str(timeout), "--bodies", str(bodies), "--out", str(out)]
    subprocess.run(cmd, check=True, timeout=seconds + timeout + 120, preexec_fn=_affinity(cpus))
    data = json.loads(out.read_text())
    shutil.rmtree(tmp, ignore_errors=True)
    return data


def overload(quick: bool, router: Path, work: Path, pin: tuple[set[int], set[int]] | None) -> dict[str, Any]:
    """Offered load ~3x the gateway's capacity (tier capacity set low): 429s promptly, nobody times out."""
    per_replica = 8
    seconds = 15.0 if quick else 60.0
    timeout = 10.0
    stack = Stack.start(plan_dict(router), speedup=1.0, one_process=True)
    _copy_router(router, stack.workdir)
    proxy_cpus, other_cpus = pin if pin else (None, None)
    gw: subprocess.Popen[bytes] | None = None
    try:
        if other_cpus:
            _pin(stack.replicas[0].pid, other_cpus)
        url, gw = start_gateway(stack, proxy_cpus, BOUTE_TIER_QUEUE_PER_REPLICA=str(per_replica))
        bodies = work / "bodies_overload.jsonl"
        write_bodies(bodies, max_tokens=16)
        # capacity: the rate of 200s while the tiers' bounds are saturated (offered ~4x a Little's-law guess
        # from the low-load service time, which overestimates: batches grow and the split is uneven)
        probe = _open_loop(url, 10.0, 5.0, timeout, bodies, other_cpus)
        ok_lat = [t for c, t in zip(probe["status"], probe["lat_s"], strict=True) if c == 200]
        service_s = float(np.median(ok_lat)) if ok_lat else 0.5
        guess = 2 * per_replica / service_s
        sat = _open_loop(url, round(4 * guess, 1), 5.0, timeout, bodies, other_cpus)
        capacity = sum(1 for c in sat["status"] if c == 200) / sat["wall_s"]
        rate = round(3 * capacity, 1)
        res = _open_loop(url, rate, seconds, timeout, bodies, other_cpus)
        status = np.asarray(res["status"])
        lat = np.asarray(res["lat_s"]) * 1e3

        def pcts(mask: np.ndarray) -> dict[str, float]:
            v = lat[mask]
            if not len(v):
                return {"n": 0}
            return {
                "n": int(len(v)),
                "p50_ms": round(float(np.percentile(v, 50)), 2),
                "p99_ms": round(float(np.percentile(v, 99)), 2),
                "max_ms": round(float(v.max()), 2),
            }

        n = len(status)
        ok = status == 200
        shed = status == 429
        served_rate = ok.sum() / res["wall_s"]
        return {
            "tier_queue_per_replica": per_replica,
            "replicas": 2,
            "backend_speedup": 1.0,
            "service_time_p50_ms_low_load": round(service_s * 1e3, 1),
            "capacity_req_per_s": round(capacity, 1),
            "offered_req_per_s": rate,
            "offered_over_capacity": round(rate / capacity, 2),
            "seconds": seconds,
            "client_timeout_s": timeout,
            "requests": n,
            "share_429": round(float(shed.mean()), 3),
            "share_200": round(float(ok.mean()), 3),
            "other_status": {str(int(c)): int((status == c).sum()) for c in set(status.tolist()) - {200, 429}},
            "client_timeouts_or_errors": int((status == 0).sum()),
            "served_req_per_s": round(float(served_rate), 1),
            "latency_429": pcts(shed),
            "latency_200": pcts(ok),
            "latency_all_max_ms": round(float(lat.max()), 1) if n else None,
            "generator_send_lag_p99_ms": round(res["send_lag_p99_ms"], 2),
            "generator_cpu_pct": round(100 * res["cpu_s"] / res["wall_s"], 1),
        }
    finally:
        if gw is not None:
            _stop(gw)
        stack.stop()


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
    pin = _pinning()
    load_before = _loadavg()
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
        "loadavg_after": _loadavg(),
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
