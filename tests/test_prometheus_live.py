"""A real Prometheus scraping a real gateway in front of emulated replicas, under load from the official client.

The config is the one ``--prometheus-config`` writes (file_sd targets, BOute's rule files beside it), with 1 s
scrape and evaluation intervals. The load is measured client-side; Prometheus' raw series must count what the
client saw (within 2%), its recorded shares match the client's, and its recorded P95 (from the histogram) lies
within the width of its bucket of the client's, its TTFT P95 of the gateway's per-request stamps. Then every expression of the shipped Grafana
dashboard, its variable substituted, must return series. Waits are on events: Prometheus ready, a scrape after
the load, a rule evaluation after that scrape.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from router.metrics import LATENCY_BUCKETS, TTFT_BUCKETS
from tests.services import free_port
from tests.stack import Stack
from tests.waits import until

pytestmark = [
    pytest.mark.timeout(120),  # starts replicas, a gateway and Prometheus
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="no prometheus binary (make test installs it via apt)"
    ),
]

DEPLOYMENT = "live"
REQUESTS = 240  # the steady phase; a burst after it makes the gateway shed
MAX_INFLIGHT = 8  # the gateway's bound: the steady phase stays under it, the burst goes over


@dataclass
class Load:
    """What the client measured: every request's status, tier, latency (s) and, streamed, its TTFT (s) as the
    client saw it and as the gateway stamped it (``x-boute-ttft-ms``: the clock its histogram uses)."""

    status: list[int] = field(default_factory=list)
    tier: list[str | None] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    ttft_stamped: list[float] = field(default_factory=list)
    ended_at: float = 0.0


@dataclass
class Prom:
    url: str
    proc: subprocess.Popen[bytes]
    config: Path
    at: float | None = None  # evaluation time of every query once set: after the load's last scrape and rules

    def query(self, expr: str) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": f"{self.at:.3f}"} if self.at is not None else {})
        r = httpx.get(self.url + "/api/v1/query", params=params, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def value(self, expr: str) -> float:
        res = self.query(expr)
        assert len(res) == 1, f"{expr}: {res}"
        return float(res[0]["value"][1])

    def by(self, expr: str, label: str) -> dict[str, float]:
        return {r["metric"].get(label, ""): float(r["value"][1]) for r in self.query(expr)}


def _messages(rng: random.Random) -> list[dict[str, str]]:
    # the plan's length scorer cuts at the reference prompts' median length: a spread of lengths uses both tiers
    return [{"role": "user", "content": "why " * rng.randint(5, 200)}]


async def _one(client: openai.AsyncOpenAI, load: Load, rng: random.Random, stream: bool) -> None:
    ask = {"model": "boute", "messages": _messages(rng), "max_tokens": rng.randint(8, 48)}
    t0 = time.perf_counter()
    try:
        raw = await client.chat.completions.with_raw_response.create(stream=stream, **ask)
        tier = raw.headers.get("x-boute-tier")
        if stream:
            first = None
            async for _ in raw.parse():
                first = first or time.perf_counter()
            load.ttft.append((first or time.perf_counter()) - t0)
            load.ttft_stamped.append(float(raw.headers["x-boute-ttft-ms"]) / 1e3)
        else:
            raw.parse()
        load.latency.append(time.perf_counter() - t0)
        load.status.append(200)
        load.tier.append(tier)
    except openai.APIStatusError as exc:
        load.status.append(exc.status_code)
        load.tier.append(None)


async def _drive(gw: str) -> Load:
    load = Load()
    rng = random.Random(52)
    client = openai.AsyncOpenAI(base_url=gw + "/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        gate = asyncio.Semaphore(MAX_INFLIGHT - 2)

        async def steady(i: int) -> None:
            async with gate:
                await _one(client, load, rng, stream=i % 3 == 0)

        await asyncio.gather(*(steady(i) for i in range(REQUESTS)))
        for _ in range(20):  # over the bound at once, until the gateway has shed at least one
            await asyncio.gather(*(_one(client, load, rng, stream=False) for _ in range(4 * MAX_INFLIGHT)))
            if 429 in load.status:
                break
    finally:
        await client.close()
    return load


def _start_prometheus(config: Path, data: Path) -> Prom:
    port = free_port()
    log = open(config.parent / "prometheus.log", "wb")  # noqa: SIM115 - lives as long as the child
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = Prom(f"http://127.0.0.1:{port}", proc, config)

    def ready() -> bool:
        try:
            return httpx.get(prom.url + "/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    until(ready, "prometheus ready", procs=[proc])
    return prom


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prom, Load]]:
    """The stack under load, scraped; yields once every request is in a scrape and a rule evaluation."""
    from boute.observability.scrape import Target, write_config

    work = tmp_path_factory.mktemp("prom")
    stack = Stack.start(speedup=2)  # latencies of ~0.05-2 s: spread over the histogram's buckets
    prom = None
    try:
        gw, gw_proc = stack.gateway(BOUTE_MAX_INFLIGHT=str(MAX_INFLIGHT), BOUTE_ADMIN_TOKEN="t")
        config = work / "prometheus.yml"
        write_config(config, DEPLOYMENT, [Target(gw)], scrape_interval_s=1.0, evaluation_interval_s=1.0)
        prom = _start_prometheus(config, work / "data")
        # the load starts after the first scrape: the gateway's series (at 0) are then the rates' first samples
        until(
            lambda: prom.query(f'boute_requests_total{{deployment="{DEPLOYMENT}"}}'), "first scrape", procs=[prom.proc]
        )
        run = asyncio.run(_drive(gw))
        # a re-plan event: the same plan made again (a new created_at), adopted through the admin API
        again = stack.plan.model_copy(update={"created_at": "2026-01-01T00:00:00+00:00"})
        r = httpx.put(gw + "/admin/plan", content=again.model_dump_json(), headers={"authorization": "Bearer t"})
        assert r.status_code == 200, r.text
        run.ended_at = time.time()
        # a scrape after the load and the re-plan with nothing in flight holds every request; a rule evaluation
        # after it holds what that scrape holds; every query is then made at that evaluation's time
        inflight = f'boute_inflight{{deployment="{DEPLOYMENT}"}}'
        scraped = f"timestamp({inflight}) and {inflight} == 0"  # timestamp() of a selector: the sample's
        until(lambda: (r := prom.query(scraped)) and float(r[0]["value"][1]) > run.ended_at, "scrape after load")
        at = prom.value(scraped)
        evaluated = f'timestamp(deployment:boute_served:increase5m{{deployment="{DEPLOYMENT}"}})'
        until(lambda: (r := prom.query(evaluated)) and float(r[0]["value"][1]) > at, "rule evaluation after it")
        prom.at = prom.value(evaluated)
        assert gw_proc.poll() is None
        yield prom, run
    finally:
        if prom is not None:
            prom.proc.terminate()
            prom.proc.wait(timeout=30)
        stack.stop()


def _bucket(value: float, bounds: tuple[float, ...]) -> tuple[float, float]:
    """The histogram bucket (lower, upper] holding ``value``."""
    lo = 0.0
    for hi in bounds:
        if value <= hi:
            return lo, hi
        lo = hi
    return lo, float("inf")


def _p95(xs: list[float]) -> float:
    return float(np.quantile(np.asarray(xs), 0.95))


def test_raw_series_count_what_the_client_saw(measured: tuple[Prom, Load]) -> None:
    prom, load = measured
    sel = f'deployment="{DEPLOYMENT}"'
    client = Counter(zip(load.status, load.tier, strict=True))
    answered = {t: n for (s, t), n in client.items() if s == 200}
    scraped = prom.by(f'sum by (tier) (boute_requests_total{{{sel}, code="200"}})', "tier")
    shed = sum(n for (s, _), n in client.items() if s == 429)
    figures = {"client_answered": answered, "prometheus_answered": scraped, "client_429": shed}
    figures["prometheus_shed"] = prom.value(f"sum(boute_rejected_total{{{sel}}})")
    figures["prometheus_latency_count"] = prom.value(f"sum(boute_latency_seconds_count{{{sel}}})")
    print("\nraw series vs client:", json.dumps(figures))
    assert set(scraped) == set(answered) == {"small", "large"}
    for tier, n in answered.items():
        assert abs(scraped[tier] - n) <= 0.02 * n, (tier, scraped[tier], n)
    assert shed > 0 and abs(figures["prometheus_shed"] - shed) <= 0.02 * shed
    total = sum(answered.values())
    assert abs(figures["prometheus_latency_count"] - total) <= 0.02 * total
    others = {s for s in load.status if s not in (200, 429)}
    assert not others, f"unexpected statuses {others}"


def test_recorded_series_match_the_load(measured: tuple[Prom, Load]) -> None:
    """The recording rules over the load (every series it moves exists, at 0, from the first scrape on): shares
    within 2 points, P95 (client-measured) and TTFT P95 (gateway-stamped) within the width of the bucket
    Prometheus' estimate lies in."""
    prom, load = measured
    sel = f'deployment="{DEPLOYMENT}"'
    ok = [t for s, t in zip(load.status, load.tier, strict=True) if s == 200]
    client_share = {t: n / len(ok) for t, n in Counter(ok).items()}
    recorded_share = prom.by(f"deployment_tier:boute_served_share:ratio5m{{{sel}}}", "tier")
    figures: dict[str, Any] = {"requests": len(load.status), "answered": len(ok), "streamed": len(load.ttft)}
    figures["share"] = {t: [client_share.get(t, 0.0), recorded_share[t]] for t in recorded_share}
    for tier, (c, r) in figures["share"].items():
        assert abs(c - r) <= 0.02, (tier, c, r)
    # latency: the client's clock. TTFT: the gateway's stamp, since the client's first chunk comes later by its
    # own parsing (tens of ms on a busy machine) beside low TTFT buckets 15-25 ms wide; the client's is shown
    for name, values, rule, bounds in (
        ("p95", load.latency, "deployment:boute_latency_seconds:p95_5m", LATENCY_BUCKETS),
        ("ttft_p95", load.ttft_stamped, "deployment:boute_ttft_seconds:p95_5m", TTFT_BUCKETS),
    ):
        c, r = _p95(values), prom.value(f"{rule}{{{sel}}}")
        lo, hi = _bucket(r, bounds)
        figures[name] = {"measured_s": c, "recorded_s": r, "bucket_s": [lo, hi]}
        assert abs(c - r) <= hi - lo, (name, c, r, (lo, hi))
    figures["ttft_p95"]["client_s"] = _p95(load.ttft)
    print("\nrecorded vs client:", json.dumps(figures))
    # the plan's promise and the tolerances the alerts use are scraped as published
    assert prom.by(f"deployment_tier:boute_plan_share:max{{{sel}}}", "tier") == {"small": 0.5, "large": 0.5}
    assert prom.by(f"boute_plan_tolerance{{{sel}}}", "check") == {
        "share": 0.02,
        "p95_over": 0.3,
        "failed": 0.005,
        "min_requests": 300.0,
    }
    assert prom.value(f"sum(boute_plan_applied_total{{{sel}}})") == 2.0  # at start-up, and the re-plan


def _expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expression) of every panel target and annotation."""
    out = [
        (f"panel {p['id']} '{p['title']}' {t['refId']}", t["expr"]) for p in dashboard["panels"] for t in p["targets"]
    ]
    out += [(f"annotation '{a['name']}'", a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]
    return out


def _substituted(expr: str) -> str:
    """The expression as Grafana sends it: the deployment variable and Grafana's interval variables filled in
    (as Grafana picks them for the last few minutes with the data source's default 15 s scrape interval)."""
    for var, value in (
        ("$deployment", DEPLOYMENT),
        ("$__rate_interval", "1m"),
        ("$__interval", "15s"),
        ("$__range", "5m"),
    ):
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def test_every_dashboard_expression_returns_series(measured: tuple[Prom, Load]) -> None:
    from boute.observability import dashboard_path

    prom, _ = measured
    dash = json.loads(dashboard_path().read_text())
    # import-ready: the datasource is an input, every query names it, one variable (the deployment)
    assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
    ds = {json.dumps(p["datasource"]) for p in dash["panels"]} | {
        json.dumps(t["datasource"]) for p in dash["panels"] for t in p["targets"]
    }
    assert ds == {json.dumps({"type": "prometheus", "uid": "${DS_PROMETHEUS}"})}
    (var,) = dash["templating"]["list"]
    assert var["name"] == "deployment"
    metric = var["query"]["query"].removeprefix("label_values(").split(",")[0]
    values = httpx.get(prom.url + "/api/v1/label/deployment/values", params={"match[]": metric}).json()["data"]
    assert values == [DEPLOYMENT]
    counts: dict[str, int] = {}
    for where, expr in _expressions(dash):
        series = prom.query(_substituted(expr))
        counts[where] = len(series)
    print("\nseries per dashboard expression:", json.dumps(counts, indent=1))
    empty = [w for w, n in counts.items() if n == 0]
    assert not empty, f"no series for {empty}"
    assert len(counts) >= 10 and {p["type"] for p in dash["panels"]} >= {"timeseries", "heatmap"}
