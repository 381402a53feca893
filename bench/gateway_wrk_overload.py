"""The overload phase of ``bench_gateway_wrk``: offered load ~3x a gateway's capacity (its tier capacity set
low) must be shed with prompt 429s, and no client may time out.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_gateway import _pin
from bench.gateway_wrk_load import open_loop, write_bodies
from bench.gateway_wrk_plans import copy_router, plan_dict
from bench.gateway_wrk_proxies import start_gateway, stop_proxy
from tests.stack import Stack


def overload(quick: bool, router: Path, work: Path, pin: tuple[set[int], set[int]] | None) -> dict[str, Any]:
    """Offered load ~3x the gateway's capacity (tier capacity set low): 429s promptly, nobody times out."""
    per_replica = 8
    seconds = 15.0 if quick else 60.0
    timeout = 10.0
    stack = Stack.start(plan_dict(router), speedup=1.0, one_process=True)
    copy_router(router, stack.workdir)
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
        probe = open_loop(url, 10.0, 5.0, timeout, bodies, other_cpus)
        ok_lat = [t for c, t in zip(probe["status"], probe["lat_s"], strict=True) if c == 200]
        service_s = float(np.median(ok_lat)) if ok_lat else 0.5
        guess = 2 * per_replica / service_s
        sat = open_loop(url, round(4 * guess, 1), 5.0, timeout, bodies, other_cpus)
        capacity = sum(1 for c in sat["status"] if c == 200) / sat["wall_s"]
        rate = round(3 * capacity, 1)
        res = open_loop(url, rate, seconds, timeout, bodies, other_cpus)
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
            stop_proxy(gw)
        stack.stop()
