"""The load generators the gateway benchmark (``bench_gateway_wrk``) drives, and the bodies they send.

wrk (closed loop, ``CONNECTIONS`` keep-alive connections, a Lua script drawing a GSM8K prompt per request) for
req/s and CPU per request; ``bench.gateway_load`` (open loop, a fixed offered rate) for overload. Both may be
pinned to CPUs apart from the proxy under test (:func:`affinity`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bench_gateway import _cpu_s

MAX_TOKENS = 4
CONNECTIONS = 64
WRK = shutil.which("wrk") or "/usr/bin/wrk"

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


def affinity(cpus: set[int] | None) -> Callable[[], None] | None:
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def loadavg() -> list[float]:
    with open("/proc/loadavg") as fh:
        return [float(x) for x in fh.read().split()[:3]]


def wrk(
    url: str, script: Path, bodies: Path, seconds: float, watch: dict[str, int], cpus: set[int] | None, seed: int = 0
) -> dict[str, Any]:
    """One wrk run; CPU of the ``watch`` processes (and wrk's own) over it, per completed request."""
    cmd = [WRK, "-t1", f"-c{CONNECTIONS}", f"-d{seconds:g}s", "--timeout", "10s", "-s", str(script), url]
    cmd += ["--", str(bodies), str(seed)]
    cpu0 = {k: _cpu_s(p) for k, p in watch.items()}
    load0 = loadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=affinity(cpus))
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
        "loadavg_1m_after": loadavg()[0],
        "wall_s": round(wall, 2),
    }
    for k, c in cpu.items():
        row[f"{k}_cpu_us_per_req"] = round(c / n * 1e6, 1)
        row[f"{k}_cpu_pct"] = round(100 * c / dur, 1)
    return row


def open_loop(url: str, rate: float, seconds: float, timeout: float, bodies: Path, cpus: set[int] | None) -> Any:
    tmp = Path(tempfile.mkdtemp(prefix="boute-ol-"))
    out = tmp / "out.json"
    cmd = [sys.executable, "-m", "bench.gateway_load", "--url", url, "--rate", str(rate), "--seconds", str(seconds)]
    cmd += ["--timeout", str(timeout), "--bodies", str(bodies), "--out", str(out)]
    subprocess.run(cmd, check=True, timeout=seconds + timeout + 120, preexec_fn=affinity(cpus))
    data = json.loads(out.read_text())
    shutil.rmtree(tmp, ignore_errors=True)
    return data
