"""Several gateway workers on one port (``--workers N``): they all answer, share the plan through Redis, merge
their metrics into one /metrics, share the admission bounds, are replaced when they die, and leave nothing
behind on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.metrics import Metrics
from router.worker_metrics import Snapshot, answered, families, merge, read_snapshot
from tests.services import free_port
from tests.stack import TEST_PLAN
from tests.waits import SAFETY_S, until

pytestmark = pytest.mark.timeout(120)  # most tests here start processes (a hang fails in 2 min, not 15)

TOKEN = "w0rkers"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


# ---- helpers ------------------------------------------------------------------------------------------------
def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except FileNotFoundError:
        return []


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().decode().split("\0")


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """/metrics as {sample name: {labels: value}}."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=SAFETY_S).text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def per_worker(m: dict, name: str) -> dict[int, float]:
    return {int(dict(k)["pid"]): v for k, v in m.get(name, {}).items()}


def total_requests(m: dict) -> float:
    return sum(m.get("boute_requests_total", {}).values())


def ask(url: str) -> str:
    """One chat completion through the official client on a new connection (SO_REUSEPORT hashes each new
    connection to a worker); returns the answering tier."""
    with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=SAFETY_S) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="boute", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert raw.http_response.status_code == 200 and raw.parse().choices[0].message.content
    return raw.headers["x-boute-tier"]


class _Lines:
    """A child's output, read on a thread; ``wait_for(prefix)`` until a line starting with it arrives."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc, self.lines = proc, []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.append(raw.decode())

    def wait_for(self, prefix: str) -> str:
        until(lambda: any(ln.startswith(prefix) for ln in self.lines), f"a line {prefix!r}", procs=[self.proc])
        return next(ln for ln in self.lines if ln.startswith(prefix))

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(self.lines)


# ---- the merge, on real registries ---------------------------------------------------------------------------
class _Gauged:
    def __init__(self, inflight: int, healthy: int) -> None:
        self.inflight, self._healthy = inflight, healthy

    def judge_failures(self) -> int:
        return 0

    def healthy_tiers(self) -> dict[str, int]:
        return {"small": self._healthy}


def _worker(pid: int, small: int, large: int, inflight: int, live: bool = True, healthy: int = 2) -> Snapshot:
    m = Metrics(_Gauged(inflight, healthy))
    for _ in range(small):
        m.observe("small", 200, 0.001)
    for _ in range(large):
        m.observe("large", 200, 0.001)
    m.refresh()
    return Snapshot(pid, 7, families(m.registry), live)


def test_merged_metrics_sum_counts_of_every_worker_and_gauges_of_the_live() -> None:
    own = _worker(1, small=3, large=1, inflight=2, healthy=1)
    live = _worker(2, small=1, large=3, inflight=5)
    dead = _worker(3, small=4, large=0, inflight=9, live=False)  # replaced: counts stay, its in-flight does not
    m: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in merge(own, [live, dead]):
        for s in fam.samples:
            m.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    assert m["boute_requests_total"] == {
        (("code", "200"), ("tier", "small")): 8,
        (("code", "200"), ("tier", "large")): 4,
    }
    assert m["boute_overhead_seconds_count"][()] == 12
    assert m["boute_overhead_seconds_bucket"][(("le", "0.001"),)] == 12
    assert m["boute_inflight"][()] == 7  # own + the live peer
    assert m["boute_served_share"] == {(("tier", "small"),): 8 / 12, (("tier", "large"),): 4 / 12}
    assert m["boute_healthy_replicas"] == {(("tier", "small"),): 1}  # shared state: the scraped worker's view
    assert m["boute_workers"][()] == 2
    assert per_worker(m, "boute_worker_requests") == {1: 4, 2: 4}
    assert per_worker(m, "boute_worker_plan_version") == {1: 7, 2: 7}


# ---- the admission bounds, shared ----------------------------------------------------------------------------
async def test_workers_share_the_admission_bounds() -> None:
    """With N workers each admits below bound / N: 2 requests in flight fill a bound of 3 for one of 2 workers,
    not for a lone gateway. Admitted requests meet a replica that refuses connections (5xx), refused ones 429."""
    from boute.serving import BackendSpec
    from boute.specs.plan import Plan
    from router.config import Settings
    from router.gateway import Gateway

    backends = [  # nothing listens on these ports
        BackendSpec(url=f"http://127.0.0.1:{free_port()}", tier="small", model="llama-3.1-8b", gpu="h100-sxm"),
        BackendSpec(url=f"http://127.0.0.1:{free_port()}", tier="large", model="llama-3.1-70b", gpu="h100-sxm", tp=4),
    ]
    body = b'{"model": "router-small", "prompt": "x", "max_tokens": 2}'
    statuses = {}
    for workers, held in ((1, 2), (2, 1), (2, 2)):
        gw = Gateway(Settings(max_inflight=3, workers=workers, retries=0), Plan.model_validate(TEST_PLAN), backends)
        await gw.start()
        try:
            gw.inflight = held  # requests already in flight on this worker
            statuses[workers, held] = (await gw.serve("completion", body)).status
        finally:
            await gw.stop()
    assert statuses == {(1, 2): 503, (2, 1): 503, (2, 2): 429}  # 503: admitted, no replica answers


# ---- real processes ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_serve_with_two_workers_answers_shares_plans_replaces_and_stops(tmp_path: Path, redis_url: str) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(TEST_PLAN))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "boute.cli.main", "serve", "--plan", str(plan), "--emulate", "--speedup", "50"]
    cmd += ["--port", str(port), "--workers", "2", "--redis", redis_url]
    env = {"BOUTE_REDIS_PREFIX": f"t-{uuid.uuid4().hex}", "BOUTE_ADMIN_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **env})
    out = _Lines(proc)
    seen: set[int] = set()
    try:
        assert "2 gateway workers" in out.wait_for("ready:")
        # the emulated replicas once (one process, the plan's 3 replicas), and one supervisor with 2 workers
        kids = children(proc.pid)
        sup = next(p for p in kids if "router" in cmdline(p))
        assert len(kids) == 2
        registry = Path(out.wait_for("started ").split("registry ", 1)[1].split()[0])
        assert len(json.loads(registry.read_text())) == 3
        until(lambda: len(children(sup)) == 2 and scrape(url)["boute_workers"][()] == 2, "both workers ready")
        workers = set(children(sup))
        seen |= workers | {sup, *kids}
        sent = 0

        def both_answered(since: dict[int, float]) -> bool:
            nonlocal sent
            assert ask(url) == tier
            sent += 1
            counts = per_worker(scrape(url), "boute_worker_requests")
            return set(counts) == workers and all(counts[p] > since.get(p, 0) for p in workers)

        tier = "small"  # TEST_PLAN: a two-word prompt is in the easy half
        until(lambda: both_answered({}), "both workers answered")
        # a plan PUT on whichever worker takes it reaches the other through Redis
        new = {**TEST_PLAN, "routing": {"tiers": ["small", "large"], "fractions": [0.0, 1.0]}}
        r = httpx.put(url + "/admin/plan", json=new, headers=AUTH, timeout=SAFETY_S)
        assert r.status_code == 200, r.text
        version = r.json()["version"]
        until(
            lambda: set(per_worker(scrape(url), "boute_worker_plan_version").values()) == {version},
            "every worker adopted the plan",
        )
        tier, before = "large", per_worker(scrape(url), "boute_worker_requests")
        until(lambda: both_answered(before), "both workers answered on the new plan")
        # a worker killed is replaced; what it counted stays in the totals (its last snapshot stays)
        args = cmdline(min(workers))
        run_dir = Path(args[args.index("--worker-dir") + 1])
        until(lambda: sum(answered(read_snapshot(f)) for f in run_dir.glob("*.json")) == sent, "snapshots current")
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        until(lambda: len(set(children(sup)) - workers) == 1 and len(children(sup)) == 2, "the worker replaced")
        workers = set(children(sup))
        seen |= workers
        until(lambda: set(per_worker(scrape(url), "boute_worker_requests")) == workers, "the new worker ready")
        assert total_requests(scrape(url)) == sent
        until(lambda: both_answered({}), "the new worker answers")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=SAFETY_S)
    text = out.text()
    assert proc.returncode == 0 and "Traceback" not in text, text
    assert "replaced" in text, text
    assert not [p for p in seen if running(p)], "processes left after SIGTERM"


def test_a_worker_that_cannot_listen_stops_the_serve_with_one_line(tmp_path: Path, redis_url: str) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(TEST_PLAN))
    backends = tmp_path / "backends.json"
    backends.write_text("[]")
    with socket.socket() as taken:  # a listener without SO_REUSEPORT holds the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(
            [sys.executable, "-m", "router", "--plan", str(plan), "--backends", str(backends)]
            + ["--port", str(port), "--workers", "2", "--redis", redis_url],
            capture_output=True,
            text=True,
            timeout=SAFETY_S,
        )
    assert r.returncode == 2, r.stderr
    assert f"error: gateway worker cannot listen on 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr


def test_more_than_one_worker_without_redis_is_a_one_line_error(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(TEST_PLAN))
    cmd = [sys.executable, "-m", "boute.cli.main", "serve", "--plan", str(plan), "--emulate", "--workers", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=SAFETY_S)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: serve: --workers 2 needs --redis"), r.stderr
