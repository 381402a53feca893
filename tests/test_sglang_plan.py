"""A two-tier plan on real SGLang servers (issue 30): ``boute deploy up --target local --sglang-cpu`` starts one
real ``sglang.launch_server`` (SmolLM2-135M, ``make sglang``) per tier of ``examples/plan-sglang-cpu.json``
behind the deployment's gateway; the official ``openai`` client is served by each tier (plain and streamed), a
SIGKILLed replica's tier answers the gateway's documented 503 while the other tier fails nothing, the
supervisor restarts it and the tier serves again, and ``boute deploy down`` leaves no process behind.

The fast tests check the command each replica gets and the one-line refusals; the slow one skips with the
reason where ``make sglang`` was not run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.deploy.desired import desired_replicas
from backends.deploy.launch import LaunchOptions, replica_process
from backends.emulated.launch import free_port
from backends.sglang import argv_flags
from boute.errors import BouteError
from boute.serving.bundle import open_plan
from tests.waits import SAFETY_S, until

PLAN = Path(__file__).resolve().parents[1] / "examples" / "plan-sglang-cpu.json"
#: real replicas start in 45-56 s alone; two at once on 2 busy cores take longer: the CLI's own bound
READY_S = 10 * SAFETY_S


def _boute(*args: str, env: dict[str, str], timeout: float = SAFETY_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boute.cli.main", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _require_sglang_server() -> None:
    """Skip, with the build's own reason, where ``make sglang`` was not run."""
    from backends.sglang.cpu import server_install

    try:
        server_install()
    except BouteError as exc:
        pytest.skip(str(exc))


def test_sglang_cpu_replica_command() -> None:
    opts = LaunchOptions(emulate=False, sglang_cpu=True, python="/srv/py", default_model_path="/m/smollm2")
    small, large = desired_replicas(open_plan(PLAN))
    spec = replica_process(large, 4321, "127.0.0.1", opts)
    argv = list(spec.argv)
    assert argv[:3] == ["/srv/py", "-m", "sglang.launch_server"]
    flags = argv_flags(argv[3:])  # flag -> value, True for a bare flag (BARE_FLAGS, checked against SGLang's parser)
    assert flags["--model-path"] == "/m/smollm2" and flags["--served-model-name"] == "large"
    assert (flags["--device"], flags["--attention-backend"]) == ("cpu", "torch_native")
    assert flags["--max-total-tokens"] == "16384" and flags["--tp-size"] == "1" and flags["--pp-size"] == "1"
    assert flags["--enable-cache-report"] is True  # hits in the usage: BOute reads them there
    assert spec.env["SGLANG_USE_CPU_ENGINE"] == "1" and spec.env["HF_HUB_OFFLINE"] == "1"
    assert spec.env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "0"  # /health a liveness check (LIVENESS_ENV)
    assert "CUDA_VISIBLE_DEVICES" not in spec.env and spec.health_url == "http://127.0.0.1:4321/health"
    # a tier of its own path keeps it; the pool size is the deployment's
    opts = LaunchOptions(
        emulate=False, sglang_cpu=True, model_paths={"small": "/m/other"}, max_total_tokens=4096, python="/p"
    )
    argv = list(replica_process(small, 4322, "127.0.0.1", opts).argv)
    assert argv[argv.index("--model-path") + 1] == "/m/other" and argv[argv.index("--max-total-tokens") + 1] == "4096"
    # an fp8 replica of a GPU plan runs in bf16 on the CPU engine (SGLang's fp8 is a GPU kernel); on a GPU it stays fp8
    fp8 = dataclasses.replace(large, dtype="fp8")
    assert "--quantization" not in replica_process(fp8, 4323, "127.0.0.1", opts).argv
    gpu = LaunchOptions(emulate=False, python="/p")
    assert "--quantization" in replica_process(fp8, 4323, "127.0.0.1", gpu).argv


def test_sglang_cpu_refusals_are_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "BOUTE_SGLANG_HOME": str(tmp_path / "empty")}  # no `make sglang` install there
    r = _boute("deploy", "up", str(PLAN), "--sglang-cpu", "--dir", str(tmp_path / "d"), env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: the SGLang CPU server is not built: run `make sglang`"]
    r = _boute("deploy", "up", str(PLAN), "--sglang-cpu", "--emulate", "--dir", str(tmp_path / "d"), env=env)
    assert r.returncode == 2 and "--sglang-cpu" in r.stderr and "Traceback" not in r.stderr
    r = _boute("deploy", "up", str(PLAN), "--emulate", "--max-total-tokens", "4096", "--dir", str(tmp_path), env=env)
    assert r.returncode == 2 and "--max-total-tokens: only with --sglang-cpu" in r.stderr


def _tree(pid: int) -> set[int]:
    import psutil

    try:
        p = psutil.Process(pid)
        return {pid, *(c.pid for c in p.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def _alive(pids: set[int]) -> set[int]:
    import psutil

    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _status(d: Path, env: dict[str, str]) -> dict[str, Any]:
    r = _boute("deploy", "status", "--dir", str(d), "--json", env=env)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


@pytest.mark.slow
@pytest.mark.sglang_server
@pytest.mark.timeout(1800)  # two real replicas start, one twice; every wait below is bounded on its own
def test_two_tier_plan_on_real_sglang(tmp_path: Path, redis_url: str) -> None:
    from openai import APIStatusError, OpenAI

    from backends.sglang.cpu import tree_rss_mb

    _require_sglang_server()
    env = {**os.environ, "BOUTE_REDIS_URL": redis_url}
    d, prefix = tmp_path / "dep", f"test-sglang-plan-{uuid.uuid4().hex[:8]}"
    seen: set[int] = set()  # every replica process (and its scheduler/detokenizer children) ever seen
    figures: dict[str, Any] = {}
    try:
        t0 = time.monotonic()
        args = ["deploy", "up", str(PLAN), "--target", "local", "--sglang-cpu", "--dir", str(d), "--prefix", prefix]
        args += ["--gateway-port", str(free_port()), "--timeout", str(READY_S), "--json"]
        r = _boute(*args, env=env, timeout=READY_S + SAFETY_S)
        assert r.returncode == 0, r.stderr
        figures["deploy_up_s"] = round(time.monotonic() - t0, 1)
        st = json.loads(r.stdout)
        assert st["status"] == "ready" and all(x["registered"] for x in st["replicas"]), st
        pids = {x["tier"]: int(x["pid"]) for x in st["replicas"]}
        assert sorted(pids) == ["large", "small"]
        for pid in pids.values():
            seen |= _tree(pid)
        figures["rss_mb"] = {t: round(tree_rss_mb(p)) for t, p in pids.items()}
        gateway = st["gateway_url"]
        until(lambda: httpx.get(gateway + "/ready", trust_env=False).status_code == 200, "gateway ready")

        client = OpenAI(base_url=gateway + "/v1", api_key="unused", timeout=SAFETY_S * 2, max_retries=0)
        ask = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 8}
        served: dict[str, int] = {"small": 0, "large": 0}
        for tier in ("small", "large"):
            raw = client.chat.completions.with_raw_response.create(model=f"router-{tier}", **ask)
            assert raw.headers["x-boute-tier"] == tier
            answer = raw.parse()
            assert answer.choices[0].message.content and answer.usage.completion_tokens > 0
            served[tier] += 1
            t1 = time.monotonic()
            raw = client.chat.completions.with_raw_response.create(model=f"router-{tier}", stream=True, **ask)
            assert raw.headers["x-boute-tier"] == tier
            figures[f"ttft_ms_{tier}"] = float(raw.headers["x-boute-ttft-ms"])
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
            figures[f"stream_s_{tier}"] = round(time.monotonic() - t1, 2)
            assert text
            served[tier] += 1
        raw = client.chat.completions.with_raw_response.create(model="boute", **ask)
        served[raw.headers["x-boute-tier"]] += 1  # the plan's routing picks a tier

        # SIGKILL the small tier's only replica: its tier answers 503 (no usable replica) with Retry-After,
        # the large tier fails nothing meanwhile; the supervisor restarts it and the tier serves again
        killed_at = time.monotonic()
        os.kill(pids["small"], signal.SIGKILL)
        outage: dict[str, int] = {}
        large_ok = large_failed = 0

        def small_back() -> bool:
            nonlocal large_ok, large_failed
            try:
                client.chat.completions.create(model="router-large", **ask)
                large_ok += 1
            except APIStatusError:
                large_failed += 1
            try:
                raw = client.chat.completions.with_raw_response.create(model="router-small", **ask)
            except APIStatusError as exc:
                assert exc.status_code == 503 and exc.response.headers.get("retry-after"), exc
                assert exc.body and "small" in str(exc.body), exc.body
                outage[exc.message] = outage.get(exc.message, 0) + 1
                return False
            small = next(x for x in _status(d, env)["replicas"] if x["tier"] == "small")
            return raw.headers["x-boute-tier"] == "small" and small["restarts"] >= 1

        until(small_back, "the killed replica restarted and serving", timeout=READY_S, interval=1.0)
        figures["restart_to_serving_s"] = round(time.monotonic() - killed_at, 1)
        figures["outage_503"] = outage
        figures["large_during_outage"] = {"ok": large_ok, "failed": large_failed}
        assert outage, "the small tier never answered 503 while its only replica was down"
        assert large_failed == 0 and large_ok > 0
        served["large"] += large_ok
        served["small"] += 1
        st = _status(d, env)
        small = next(x for x in st["replicas"] if x["tier"] == "small")
        assert small["restarts"] == 1 and small["registered"]
        seen |= _tree(int(small["pid"]))
        figures["served"] = served
    finally:
        r = _boute("deploy", "down", "--dir", str(d), env=env, timeout=180)
        print(f"\nsglang plan figures: {json.dumps(figures)}")
    assert r.returncode == 0 and "stopped 2 replicas" in r.stdout, r.stdout + r.stderr
    until(lambda: not _alive(seen), f"no replica process left (alive: {_alive(seen)})", timeout=SAFETY_S)


def two_replica_plan(path: Path) -> Path:
    """``examples/plan-sglang-cpu.json`` with two replicas in the small tier (three real replicas in all: ~8.5 GB
    of RSS, what this 24 GB host holds with room to spare)."""
    doc = json.loads(PLAN.read_text())
    for group in doc["deployment"]:
        if group["tier"] == "small":
            group["count"] = 2
    path.write_text(json.dumps(doc, indent=1))
    return path


@dataclass
class _Load:
    """Closed-loop load on one tier through the gateway: ``workers`` threads, each sending the next
    non-streamed request once its last one came back; every outcome kept (monotonic end time, replica, error)."""

    client: Any
    model: str
    ask: dict[str, Any]
    workers: int = 2
    done: list[tuple[float, str | None, str | None]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def _worker(self) -> None:
        while not self.stop.is_set():
            try:
                raw = self.client.chat.completions.with_raw_response.create(model=self.model, **self.ask)
                raw.parse()
                self.done.append((time.monotonic(), raw.headers.get("x-boute-replica"), None))
            except Exception as exc:  # every failure counts: status errors, timeouts, resets
                self.done.append((time.monotonic(), None, f"{type(exc).__name__}: {exc}"[:300]))

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(self.workers)]
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=READY_S)

    def served_by(self, replica: str, after: float = 0.0) -> int:
        return sum(1 for t, r, err in list(self.done) if r == replica and err is None and t > after)

    @property
    def failures(self) -> list[str]:
        return [err for _, _, err in list(self.done) if err is not None]


@pytest.mark.slow
@pytest.mark.sglang_server
@pytest.mark.timeout(2400)  # three real replicas start, one twice; every wait below is bounded on its own
def test_failover_within_a_tier_on_real_sglang_fails_no_request(tmp_path: Path, redis_url: str) -> None:
    """Two real SGLang replicas in the small tier under steady load through the gateway; SIGKILL one: the gateway
    retries what it had in flight on the other (before any byte reached the client) and routes around the dead
    one, so no request fails; the supervisor restarts it and it serves again. Non-streamed requests: a stream
    whose first chunk was relayed cannot be retried (it ends with an SSE error event, by design)."""
    from openai import OpenAI

    _require_sglang_server()
    env = {**os.environ, "BOUTE_REDIS_URL": redis_url}
    d, prefix = tmp_path / "dep", f"test-sglang-failover-{uuid.uuid4().hex[:8]}"
    plan = two_replica_plan(tmp_path / "plan.json")
    seen: set[int] = set()
    figures: dict[str, Any] = {}
    load: _Load | None = None
    try:
        t0 = time.monotonic()
        args = ["deploy", "up", str(plan), "--target", "local", "--sglang-cpu", "--dir", str(d), "--prefix", prefix]
        args += ["--gateway-port", str(free_port()), "--timeout", str(2 * READY_S), "--json"]
        r = _boute(*args, env=env, timeout=2 * READY_S + SAFETY_S)
        assert r.returncode == 0, r.stderr
        figures["deploy_up_s"] = round(time.monotonic() - t0, 1)
        st = json.loads(r.stdout)
        assert st["status"] == "ready" and all(x["registered"] for x in st["replicas"]), st
        small = sorted((x for x in st["replicas"] if x["tier"] == "small"), key=lambda x: str(x["id"]))
        assert len(small) == 2
        for x in st["replicas"]:
            seen |= _tree(int(x["pid"]))
        victim, survivor = str(small[0]["id"]), str(small[1]["id"])
        gateway = st["gateway_url"]
        until(lambda: httpx.get(gateway + "/ready", trust_env=False).status_code == 200, "gateway ready")

        client = OpenAI(base_url=gateway + "/v1", api_key="unused", timeout=READY_S, max_retries=0)
        ask = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 8}
        load = _Load(client, "router-small", ask)
        load.start()
        until(
            lambda: load.served_by(victim) >= 2 and load.served_by(survivor) >= 2,
            "both small replicas serving under load",
            timeout=READY_S,
            interval=0.5,
        )
        figures["before_kill"] = len(load.done)
        killed_at = time.monotonic()
        os.kill(int(small[0]["pid"]), signal.SIGKILL)

        def victim_back() -> bool:
            if load.served_by(victim, after=killed_at) < 1:
                return False
            return next(x for x in _status(d, env)["replicas"] if x["id"] == victim)["restarts"] >= 1

        until(lambda: load.served_by(survivor, after=killed_at) >= 1, "the survivor serving", timeout=SAFETY_S)
        figures["first_answer_after_kill_s"] = round(
            min(t for t, rep, err in load.done if err is None and t > killed_at) - killed_at, 1
        )
        until(victim_back, "the killed replica restarted and serving again", timeout=2 * READY_S, interval=1.0)
        figures["kill_to_victim_serving_s"] = round(time.monotonic() - killed_at, 1)
        load.finish()
        figures["requests"] = len(load.done)
        figures["served"] = {"victim": load.served_by(victim), "survivor": load.served_by(survivor)}
        figures["during_outage_by_survivor"] = load.served_by(survivor, after=killed_at)
        figures["failed"] = len(load.failures)
        assert not load.failures, load.failures[:5]
        st = _status(d, env)
        again = next(x for x in st["replicas"] if x["id"] == victim)
        assert again["restarts"] == 1 and again["registered"]
        seen |= _tree(int(again["pid"]))
    finally:
        if load is not None:
            load.finish()
        r = _boute("deploy", "down", "--dir", str(d), env=env, timeout=180)
        print(f"\nsglang failover figures: {json.dumps(figures)}")
    assert r.returncode == 0 and "stopped 3 replicas" in r.stdout, r.stdout + r.stderr
    until(lambda: not _alive(seen), f"no replica process left (alive: {_alive(seen)})", timeout=SAFETY_S)
