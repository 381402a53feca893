"""Prometheus metrics, one registry per gateway (several gateways may live in one test process).

Labelled children are cached so the hot path does a dict lookup, not a label resolution, per request.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 1.0)


class Metrics:
    def __init__(self, gateway: Any) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "boute_requests", "completion requests by final tier and status", ["tier", "code"], registry=r
        )
        self.overhead = Histogram(
            "boute_overhead_seconds", "time spent in the gateway itself", buckets=OVERHEAD_BUCKETS, registry=r
        )
        self.rejected = Counter("boute_rejected", "requests refused with 429 (in-flight bound)", registry=r)
        self.escalations = Counter("boute_escalations", "cascade escalations to a larger tier", registry=r)
        inflight = Gauge("boute_inflight", "requests in progress", registry=r)
        inflight.set_function(lambda: gateway.inflight)
        healthy = Gauge("boute_healthy_replicas", "available replicas per tier", ["tier"], registry=r)
        self._healthy = healthy
        self._gateway = gateway
        self._children: dict[tuple[str, int], Any] = {}

    def count(self, tier: str, code: int) -> None:
        key = (tier, code)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.requests.labels(tier, str(code))
        child.inc()

    def observe(self, tier: str, code: int, overhead_s: float) -> None:
        self.count(tier, code)
        self.overhead.observe(overhead_s)

    def render(self) -> bytes:
        for tier, n in self._gateway.balancer.healthy_tiers().items():
            self._healthy.labels(tier).set(n)
        return generate_latest(self.registry)
