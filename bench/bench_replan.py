"""Online re-planning, measured end to end on emulated backends (issue 15).

Each experiment deploys the scenario's optimised plan with ``boute deploy up --emulate`` (one process per
replica, real-time modelled timing, a gateway that pushes what it serves to Redis), runs ``boute replan``
beside it, and replays a changing workload through the gateway with the open-loop generator
(``boute.serving.loadgen``, its own process):

- ``rate_step``: the scenario's rate, then 1.5x;
- ``gpu_loss``: steady, then every replica on one GPU type SIGKILLed with restarts made to fail (the type is
  gone, as a lost node's GPUs would be);
- ``mix_shift``: traffic slowly moves to the prompts with the longest answers;
- ``steady``: the scenario's own traffic for ``steady_s`` seconds: no re-plan may fire;
- ``warm_vs_cold``: evaluations and wall time to an equally good plan after the rate step, the search
  warm-started from the first search's trials vs from nothing (in-process, fast evaluator).

Reported per experiment: time to detect (first trigger after the change), time to the new plan live,
P95 before / during / after the transition vs the promises, failed requests. Latencies are real seconds
(speedup 1); like every latency here they inherit the performance model's error.
"""

from __future__ import annotations

import contextlib
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

import numpy as np

from boute.stats import quantile

SCENARIO = "builtin:paper-gsm8k"


def _boute(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "boute", *argv], capture_output=True, text=True, check=False, env=env)


class Deployment:
    """An optimised plan deployed on emulated replicas, its gateway, and (optionally) the autopilot."""

    def __init__(self, work: Path, scenario: str, redis_url: str, *, quick: bool) -> None:
        from tests.services import free_port

        self.work, self.redis_url, self.quick = work, redis_url, quick
        self.dir = work / "deploy"
        self.db = f"sqlite:///{work / 'boute.db'}"
        self.prefix = f"bench-replan-{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.dead = work / "dead-gpus"
        self.env = {**os.environ, "BOUTE_EMULATED_DEAD_GPUS": str(self.dead)}
        self.experiment = "initial"
        self.pilot: subprocess.Popen[str] | None = None
        r = _boute(
            "optimize", "--scenario", scenario, "--out", str(work / "plan.json"), "--db", self.db,
            "--experiment", self.experiment, "-q",
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"optimize failed: {r.stderr[-500:]}")
        r = _boute(
            "deploy", "up", str(work / "plan.json"), "--emulate", "--dir", str(self.dir), "--prefix", self.prefix,
            "--redis", redis_url, "--gateway-port", str(self.port), "--json", "--timeout", "300", env=self.env,
        )  # fmt: skip
        if r.returncode != 0:
            self.close()  # whatever came up before the failure
            raise RuntimeError(f"deploy failed: {r.stderr[-800:]}")
        self.url = json.loads(r.stdout)["gateway_url"]

    def autopilot(self, *extra: str) -> None:
        self.pilot_log = open(self.work / "replan.log", "w")  # noqa: SIM115 - lives as long as the child
        argv = [sys.executable, "-m", "boute", "replan", "--dir", str(self.dir), "--db", self.db]
        argv += ["--warm-from", self.experiment, "--interval", "5", *extra]  # the CLI default window (60 s)
        self.pilot = subprocess.Popen(argv, stdout=self.pilot_log, stderr=subprocess.STDOUT, text=True)

    def replicas(self) -> list[dict[str, Any]]:
        from backends.deploy.state import read_state

        return list((read_state(self.dir) or {}).get("replicas", []))

    def decisions(self) -> list[dict[str, Any]]:
        from boute.tracking import open_store

        store = open_store(self.db)
        try:
            return store.replans(str(self.dir))
        finally:
            store.close()

    def close(self) -> None:
        if self.pilot is not None and self.pilot.poll() is None:
            self.pilot.send_signal(signal.SIGINT)
            try:
                self.pilot.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.pilot.kill()
                self.pilot.wait()
        _boute("deploy", "down", "--dir", str(self.dir))
        from backends.deploy.registry import Registry

        reg = Registry(self.redis_url, self.prefix)
        reg.clear()
        reg.close()


def schedule(scenario: str, phases: list[tuple[float, float, float, float]], seed: int = 0) -> dict[str, Any]:
    """Arrivals and held-out prompts for ``phases`` of (seconds, req/s, long-answer share at start, at end):
    the scenario's arrival process at each phase's rate; a growing share of prompts drawn from the held-out
    prompts whose recorded answers are longest (the mix shift)."""
    from boute.quality import quality_model_for
    from boute.quality.build import profile_for
    from boute.specs import load_scenario
    from boute.workload import build_workload

    sc = load_scenario(scenario)
    profile = profile_for(sc)
    held = np.asarray(quality_model_for(sc).test_index)
    answer_len = np.array([max(len(profile.responses[m][i]) for m in profile.responses) for i in held])
    long_rows = held[answer_len >= np.quantile(answer_len, 0.75)]
    rng = np.random.default_rng(seed)
    send, rows, t_off = [], [], 0.0
    for k, (dur, rate, s0, s1) in enumerate(phases):
        w = build_workload(sc, rate_rps=rate, duration_s=dur, seed=seed + k)
        share = s0 + (s1 - s0) * (w.arrival_s / dur)
        pick_long = rng.random(len(w.arrival_s)) < share
        rows.append(np.where(pick_long, rng.choice(long_rows, len(share)), rng.choice(held, len(share))))
        send.append(w.arrival_s + t_off)
        t_off += dur
    r = np.concatenate(rows)
    bodies = [json.dumps({"model": "boute", "messages": [{"role": "user", "content": profile.prompts[i]}]}) for i in r]
    return {"send_at": np.concatenate(send).tolist(), "bodies": bodies, "rows": r.tolist()}


def drive(url: str, sched: dict[str, Any], work: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Start the open-loop generator on the schedule (its own process); returns it and its results file."""
    spec = {"url": url, "send_at": sched["send_at"], "bodies": sched["bodies"], "speedup": 1.0, "timeout_s": 120.0}
    req, res = work / f"requests-{uuid.uuid4().hex[:6]}.json", work / f"results-{uuid.uuid4().hex[:6]}.json"
    req.write_text(json.dumps(spec))
    proc = subprocess.Popen([sys.executable, "-m", "boute.serving.loadgen", str(req), str(res)])
    return proc, res


def _p95(lat: np.ndarray) -> float | None:
    return round(quantile(lat, 0.95), 3) if lat.size else None


def analyse(
    res: dict[str, Any], sched: dict[str, Any], change_at: float, decisions: list[dict[str, Any]]
) -> dict[str, Any]:
    """Figures around the change at ``change_at`` (seconds into the schedule)."""
    t0 = float(res["t0_epoch"])
    send = np.asarray(sched["send_at"])
    status = np.asarray(res["status"])
    lat = np.asarray(res["latency_s"], dtype=float)
    ok = status == 200
    fired = [(float(t["at"]) - t0, t["kind"]) for d in decisions for t in d["triggers"]]
    after_change = [(s, k) for s, k in fired if s >= change_at]
    live = [
        (float(d["triggers"][0]["at"]) - t0 + float(d["wall_s"]), d) for d in decisions if d["status"] == "deployed"
    ]
    live_after = [(s, d) for s, d in live if s >= change_at]
    out: dict[str, Any] = {
        "requests": int(len(status)),
        "failed": int((~ok).sum()),
        "failed_by_status": {str(c): int((status == c).sum()) for c in sorted(set(status.tolist())) if c != 200},
        "triggers": [{"at_s": round(s, 1), "kind": k} for s, k in fired],
        "p95_before_s": _p95(lat[ok & (send < change_at)]),
    }
    if after_change:
        out["detect_s"] = round(after_change[0][0] - change_at, 1)
    if live_after:
        out["new_plan_live_s"] = round(live_after[0][0] - change_at, 1)
        out["p95_during_s"] = _p95(lat[ok & (send >= change_at) & (send < live_after[0][0])])
    else:
        out["p95_after_change_s"] = _p95(lat[ok & (send >= change_at)])
    # each re-plan: when it went live, what it promised, and what was served from 30 s after it to the next
    phases = []
    for i, (t_live, d) in enumerate(live):
        end = live[i + 1][0] if i + 1 < len(live) else float(send[-1]) + 1.0
        sel = ok & (send >= t_live + 30.0) & (send < end)
        phases.append(
            {
                "live_at_s": round(t_live, 1),
                "triggers": [t["kind"] for t in d["triggers"]],
                "promised_p95_s": ((d.get("new_plan") or {}).get("predicted") or {}).get("p95_latency_s"),
                "served_p95_s": _p95(lat[sel]),
                "requests": int(sel.sum()),
                "gain": d.get("gain"),
                "deployment": (d.get("new_plan") or {}).get("deployment"),
            }
        )
    out["replanned"] = phases
    out["replans"] = [{"status": d["status"], "detail": d.get("detail")} for d in decisions]
    return out


def experiment(kind: str, work: Path, redis_url: str, quick: bool) -> dict[str, Any]:
    from boute.specs import load_scenario

    rate = load_scenario(SCENARIO).workload.rate_rps
    with contextlib.ExitStack() as stack:
        dep = Deployment(work, SCENARIO, redis_url, quick=quick)  # cleans up after itself if it fails
        stack.callback(dep.close)
        return _experiment(kind, dep, rate, work, stack)


def _experiment(kind: str, dep: Deployment, rate: float, work: Path, stack: contextlib.ExitStack) -> dict[str, Any]:
    quick = dep.quick
    base = 60.0 if quick else 90.0
    if kind == "rate_step":
        phases = [(base, rate, 0, 0), (150.0 if quick else 300.0, 1.5 * rate, 0, 0)]
    elif kind == "mix_shift":
        phases = [
            (base, rate, 0, 0),
            (240.0 if quick else 300.0, rate, 0, 1),
            (60.0 if quick else 120.0, rate, 1, 1),
        ]
    elif kind == "gpu_loss":
        phases = [(base, rate, 0, 0), (150.0 if quick else 240.0, rate, 0, 0)]
    else:  # steady
        phases = [(120.0 if quick else 600.0, rate, 0, 0)]
    sched = schedule(SCENARIO, phases)
    dep.autopilot()
    proc, res_file = drive(dep.url, sched, work)
    stack.callback(lambda: proc.poll() is None and proc.kill())
    lost_gpu = None
    if kind == "gpu_loss":
        time.sleep(base)
        gpus = sorted({r["gpu"] for r in dep.replicas()}, key=lambda g: g != "rtx-4090")
        lost_gpu = gpus[0]
        dep.dead.write_text(lost_gpu + "\n")
        for r in dep.replicas():
            if r["gpu"] == lost_gpu and r.get("pid"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(r["pid"]), signal.SIGKILL)
    proc.wait()
    time.sleep(12)  # the autopilot's last checks
    res = json.loads(res_file.read_text())
    out = analyse(res, sched, 0.0 if kind == "steady" else base, dep.decisions())
    out["phases"] = [{"seconds": d, "rate_rps": r, "long_share": [a, b]} for d, r, a, b in phases]
    out["generator_cpu_share"] = round(res["cpu_s"] / max(res["wall_s"], 1e-9), 3)
    if lost_gpu:
        out["lost_gpu"] = lost_gpu
    return out


def warm_vs_cold(quick: bool) -> dict[str, Any]:
    """Evaluations and wall time to an equally good plan after the rate step: warm (re-scored trials of the
    first search, then MOBO) vs cold (MOBO from its initial design), fast evaluator, several seeds."""
    from boute.optimize import session
    from boute.optimize.evaluators import FastEvaluator
    from boute.optimize.session import SearchRuntime
    from boute.optimize.settings import SearchSettings
    from boute.replan.warm import seed_experiment, warm_trials
    from boute.specs import load_scenario
    from boute.tracking import open_store

    sc = load_scenario(SCENARIO)
    seeds = range(2 if quick else 5)
    evals = 40 if quick else 60
    stepped = sc.model_copy(
        update={"workload": sc.workload.model_copy(update={"rate_rps": sc.workload.rate_rps * 1.5 * 1.1})}
    )
    out: dict[str, Any] = {"rate_rps": stepped.workload.rate_rps, "seeds": []}
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/w.db")
        try:
            session.optimize(
                sc,
                SearchSettings(max_evals=evals, experiment="first", patience=None, batch=1, workers=1),
                SearchRuntime(evaluator=FastEvaluator(sc), store=store),
            )
            for seed in seeds:
                runs: dict[str, Any] = {}
                for mode in ("cold", "warm"):
                    ev = FastEvaluator(stepped)
                    t0 = time.perf_counter()
                    name = f"{mode}-{seed}"
                    warm = warm_trials(store, ["first"], stepped, ev) if mode == "warm" else []
                    settings = SearchSettings(
                        max_evals=len(warm) + evals, seed=seed, experiment=name, patience=None, evaluator="fast",
                        batch=1, workers=1,
                    )  # fmt: skip
                    if warm:
                        seed_experiment(store, stepped, warm, settings)
                    res = session.optimize(stepped, settings, SearchRuntime(evaluator=ev, store=store))
                    wall = time.perf_counter() - t0
                    best = [t.result.p95_latency_s if t.ok and t.result.feasible else np.inf for t in res.trials]
                    runs[mode] = {"trace": np.minimum.accumulate(best).tolist(), "warm": len(warm), "wall_s": wall}
                target = min(min(r["trace"]) for r in runs.values()) * 1.02
                for r in runs.values():
                    hit = next((i + 1 for i, v in enumerate(r["trace"]) if v <= target), None)
                    r["evals_to_within_2pct"] = hit
                    r["wall_s_to_within_2pct"] = None if hit is None else round(r["wall_s"] * hit / len(r["trace"]), 2)
                    r["best_p95_s"] = round(min(r["trace"]), 3)
                    del r["trace"]
                out["seeds"].append({"seed": seed, **runs})
        finally:
            store.close()
    for mode in ("cold", "warm"):
        hits = [s[mode]["evals_to_within_2pct"] for s in out["seeds"]]
        out[f"{mode}_median_evals"] = float(np.median([h if h is not None else np.inf for h in hits]))
    return out


KINDS = ("warm_vs_cold", "rate_step", "gpu_loss", "mix_shift", "steady")


def run(quick: bool) -> dict[str, Any]:
    """All experiments; ``BOUTE_BENCH_REPLAN_ONLY=rate_step,steady`` re-runs only those and carries the others
    over from the previous results file, each labelled with the run it comes from."""
    redis_url = os.environ.get("BOUTE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    out: dict[str, Any] = {"scenario": SCENARIO, "note": "emulated backends, real time; the perf model is approximate"}
    only = [k for k in os.environ.get("BOUTE_BENCH_REPLAN_ONLY", "").split(",") if k]
    if unknown := set(only) - set(KINDS):
        raise SystemExit(f"BOUTE_BENCH_REPLAN_ONLY: unknown experiment(s) {sorted(unknown)} (known: {KINDS})")
    previous = Path(__file__).parent / "results" / "replan.json"
    if only and previous.is_file():
        old = json.loads(previous.read_text())
        for kind in KINDS:
            if kind not in only and kind in old.get("results", {}):
                carried = old["results"][kind]
                out[kind] = carried | {"carried_from": carried.get("carried_from", old["meta"]["when"])}
    if not only or "warm_vs_cold" in only:
        out["warm_vs_cold"] = warm_vs_cold(quick)
    for kind in ("rate_step", "gpu_loss", "mix_shift", "steady"):
        if only and kind not in only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"boute-replan-{kind}-") as tmp:
            out[kind] = experiment(kind, Path(tmp), redis_url, quick)
            out[kind]["loadavg_after"] = os.getloadavg()
        print(f"[bench] replan {kind}: {json.dumps(out[kind])[:400]}", flush=True)
    return out
