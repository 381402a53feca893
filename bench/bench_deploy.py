"""Deployment on Ray through the CLI (issue 6 must-show), as a user runs it, with emulated replicas.

1. ``boute optimize`` writes plan A for the built-in scenario and plan B for a lower budget;
2. ``boute deploy A --target ray --emulate --gateway-port P`` (a one-node Ray cluster whose custom
   resources stand in for the scenario's GPU inventory): time to ready, where each replica landed;
3. clients send requests through the gateway while ``boute deploy B ...`` rolls the fleet to plan B:
   requests answered and failed, time the update took;
4. one replica's process is SIGKILLed: time until the controller deregisters it, and until it is
   restarted and registered again; then ``boute deploy down``.

Emulated replicas answer with the performance model's timings (``--speedup 20``), so what is measured is
the deployment machinery (Ray placement, readiness, registry, gateway, rolling update), not a GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


def _boute(*args: str, timeout: float = 900) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "boute", *args], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def _plans(tmp: Path, evals: int) -> tuple[Path, Path, dict[str, Any]]:
    """Plan A (built-in scenario) and plan B (10% less budget, or another seed if that is infeasible)."""
    db = f"sqlite:///{tmp / 'plans.db'}"
    a, b = tmp / "a.json", tmp / "b.json"
    common = ["--max-evals", str(evals), "--quiet", "--no-confirm", "--db", db]
    code, _, err = _boute("optimize", "--out", str(a), "--experiment", "a", *common)
    if code != 0:
        raise RuntimeError(f"optimize A failed: {err[-500:]}")
    cost_a = float(json.loads(a.read_text())["predicted"]["cost_per_hour"])
    code, _, _ = _boute("optimize", "--out", str(b), "--experiment", "b", "--budget", f"{0.9 * cost_a:.2f}", *common)
    how = "budget -10%"
    if code != 0:
        code, _, err = _boute("optimize", "--out", str(b), "--experiment", "b2", "--seed", "1", *common)
        how = "seed 1"
        if code != 0:
            raise RuntimeError(f"optimize B failed: {err[-500:]}")
    return a, b, {"plan_a_cost_per_hour": cost_a, "plan_b_from": how}


def _groups(plan: Path) -> list[str]:
    doc = json.loads(plan.read_text())
    return [
        f"{g['tier']}: {g.get('count', 1)}x {g['model']} on {g['gpu']} tp{g.get('tp', 1)}pp{g.get('pp', 1)}"
        for g in doc["deployment"]
    ]


def run(quick: bool) -> dict[str, Any]:
    from backends.deploy.registry import Registry
    from tests.deploy_helpers import Load, wait_for
    from tests.services import free_port

    redis_url = os.environ.get("BOUTE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"bench-deploy-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        a, b, plan_info = _plans(tmp, 20 if quick else 40)
        d, port = tmp / "deploy", free_port()
        flags = ["--target", "ray", "--emulate", "--speedup", "20", "--dir", str(d), "--redis", redis_url]
        flags += ["--prefix", prefix, "--json"]
        out: dict[str, Any] = {"plan_a": _groups(a), "plan_b": _groups(b), **plan_info}
        try:
            t0 = time.perf_counter()
            code, stdout, err = _boute("deploy", "up", str(a), *flags, "--gateway-port", str(port))
            out["deploy_a_exit_code"], out["deploy_a_s"] = code, round(time.perf_counter() - t0, 1)
            if code != 0:
                return {**out, "error": err[-1500:]}
            st = json.loads(stdout)
            out["placement_a"] = [
                {"replica": r["id"], "resources": r.get("resources"), "registered": r["registered"]}
                for r in st["replicas"]
            ]
            out["placement_ok"] = all(r.get("resources") == {f"gpu_{r['gpu']}": float(r["tp"] * r["pp"])}
                                      for r in st["replicas"])  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            with Load(url, clients=4) as load:
                time.sleep(2.0)
                t1 = time.perf_counter()
                code, stdout, err = _boute("deploy", "up", str(b), *flags)
                out["rolling_update_exit_code"], out["rolling_update_s"] = code, round(time.perf_counter() - t1, 1)
                time.sleep(2.0)
            out["requests_during_update"] = dict(load.outcomes)
            out["failed_during_update"] = load.failed
            out["answered_by_tier"] = dict(load.tiers)
            if code != 0:
                return {**out, "error": err[-1500:]}
            st = json.loads(stdout)
            reg = Registry(redis_url, prefix)
            out["registered_after_update"] = sorted(e["name"] for e in reg.entries())
            out["fleet_after_update"] = sorted(r["id"] for r in st["replicas"])

            victim = st["replicas"][0]
            os.kill(int(victim["pid"]), signal.SIGKILL)
            t2 = time.perf_counter()
            gone = wait_for(lambda: victim["id"] not in {e["name"] for e in reg.entries()}, 30, 0.05)
            t_gone = time.perf_counter() - t2
            back = wait_for(lambda: victim["id"] in {e["name"] for e in reg.entries()}, 60, 0.05)
            t_back = time.perf_counter() - t2
            out["killed_replica"] = {
                "replica": victim["id"],
                "deregistered": gone,
                "deregistered_after_s": round(t_gone, 2) if gone else None,
                "re_registered": back,
                "re_registered_after_s": round(t_back, 2) if back else None,
            }
            code, stdout, _ = _boute("deploy", "status", "--dir", str(d), "--json")
            if code == 0:
                row = next(r for r in json.loads(stdout)["replicas"] if r["id"] == victim["id"])
                out["killed_replica"]["restarts"] = row.get("restarts")
        finally:
            code, stdout, err = _boute("deploy", "down", "--dir", str(d))
            out["down"] = (stdout or err).strip()[-300:]
    return out
