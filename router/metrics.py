"""Prometheus metrics, one registry per gateway (several gateways may live in one test process).

Labelled children are cached so the hot path does a dict lookup, not a label resolution, per request.
The recording and alert rules over these series, and the Grafana dashboard, ship in
``boute/observability/`` (docs/observability.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from boute.replan.drift import Thresholds
from boute.serving.verify import Tolerances
from boute.specs.plan import Plan
from router.observe import CACHED_USAGE, PROMPT_USAGE, usage_count

OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 1.0)
#: the bounds a request is shed by (``router.errors.Overloaded.reason``), each counted from 0 at start-up
SHED_REASONS = ("inflight", "tier_queue", "scoring")
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)
#: time to first token: the latency buckets and two below them (a small model's first token takes tens of ms; with
#: 50 ms the first bound, a TTFT P95 under it could only read "somewhere in 0-50 ms")
TTFT_BUCKETS = (0.01, 0.025, *LATENCY_BUCKETS)


class Gauged(Protocol):
    """What the gauges read from the gateway (:class:`router.gateway.Gateway`) when they are scraped."""

    @property
    def inflight(self) -> int: ...

    def judge_failures(self) -> int: ...

    def healthy_tiers(self) -> dict[str, int]: ...


def tolerances() -> dict[str, float]:
    """``boute_plan_tolerance{check}``: the figures ``boute verify`` (share) and the re-plan drift detector
    (P95, failures, the smallest window judged) hold the served traffic to, read where they are defined."""
    tol, th = Tolerances(), Thresholds()
    return {
        "share": tol.share,
        "p95_over": th.p95_over,
        "failed": th.max_failed,
        "min_requests": float(th.min_requests),
    }


class Fleet(Protocol):
    """The metrics of every worker process serving one port, merged (:class:`router.worker_metrics.WorkerMetrics`)."""

    def render(self) -> bytes: ...


class Metrics:
    def __init__(self, gateway: Gauged) -> None:
        self.registry = CollectorRegistry()
        #: set in a worker of several on one port: /metrics then answers for all of them
        self.fleet: Fleet | None = None
        r = self.registry
        self.requests = Counter(
            "boute_requests", "completion requests by final tier and status", ["tier", "code"], registry=r
        )
        self.overhead = Histogram(
            "boute_overhead_seconds", "time spent in the gateway itself", buckets=OVERHEAD_BUCKETS, registry=r
        )
        self.rejected = Counter(
            "boute_rejected",
            "requests refused with 429, by bound: inflight, tier_queue, scoring",
            ["reason"],
            registry=r,
        )
        for reason in SHED_REASONS:
            self.rejected.labels(reason)
        self.latency = Histogram(
            "boute_latency_seconds",
            "end-to-end latency of successful requests by final tier (streams: to the last byte)",
            ["tier"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "boute_ttft_seconds",
            "time to the first answer bytes of streamed requests by answering tier (a cascade's: after every judged "
            "hop, the accepted answer's)",
            ["tier"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.stream_failed = Counter(
            "boute_stream_failed",
            "streams that began (counted 200 in boute_requests) and then failed upstream",
            ["tier"],
            registry=r,
        )
        self.escalations = Counter("boute_escalations", "cascade escalations to a larger tier", registry=r)
        self._cache_series(r)
        self._promise(r)
        self._read_at_scrape(r, gateway)
        healthy = Gauge("boute_healthy_replicas", "available replicas per tier", ["tier"], registry=r)
        self._healthy = healthy
        self._gateway = gateway
        self._children: dict[tuple[str, int], Counter] = {}
        self._latency: dict[str, Histogram] = {}
        self._ttft: dict[str, Histogram] = {}
        self._routed: dict[tuple[str, str], Counter] = {}
        self._chars: dict[str, tuple[Counter, Counter]] = {}
        self._tokens: dict[tuple[str, str], tuple[Counter, Counter]] = {}

    def _cache_series(self, r: CollectorRegistry) -> None:
        """Prefix affinity (router.balancer, boute.sim.affinity) and the prompt tokens replicas had cached: the
        matched share is matched / prompt characters, the hit rate cached / prompt tokens."""
        self.affinity_routed = Counter(
            "boute_affinity_routed",
            "requests placed by the prefix-affinity rule, by tier and why: affinity (longest prefix), new_prefix "
            "(rendezvous of its first block), imbalance or short_match (least load), bounded (the longest match's "
            "holders at their bounded load: the next match within its bound)",
            ["tier", "reason"],
            registry=r,
        )
        self.affinity_matched = Counter(
            "boute_affinity_matched_chars", "prompt characters matched in the tier's prefix index", ["tier"], registry=r
        )
        self.affinity_hashed = Counter(
            "boute_affinity_prompt_chars", "prompt characters hashed for prefix affinity", ["tier"], registry=r
        )
        self.prompt_tokens = Counter(
            "boute_prompt_tokens",
            "prompt tokens of answered requests (usage.prompt_tokens)",
            ["tier", "replica"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "boute_cached_tokens",
            "prompt tokens the replica had cached (usage.prompt_tokens_details.cached_tokens; none reported: 0)",
            ["tier", "replica"],
            registry=r,
        )

    def _promise(self, r: CollectorRegistry) -> None:
        """The plan's promise, beside what is measured (share: boute_served_share; P95: boute_latency_seconds)."""
        self.promised_share = Gauge(
            "boute_plan_share", "share of requests the plan sends to each tier", ["tier"], registry=r
        )
        self.promised_p95 = Gauge("boute_plan_p95_seconds", "P95 latency the plan promises", registry=r)
        self.promised_quality = Gauge("boute_plan_quality", "quality the plan promises", registry=r)
        self.served_share = Gauge(
            "boute_served_share", "share of successful requests served by each tier", ["tier"], registry=r
        )

    def _read_at_scrape(self, r: CollectorRegistry, gateway: Gauged) -> None:
        """Gauges read from the gateway when scraped, the plans it adopted (re-plan events) and the tolerances
        the alert rules hold the promise to."""
        judge_failed = Gauge(
            "boute_judge_failures",
            "answers the current plan's cascade judge could not score (error, timeout, no rating): each escalated",
            registry=r,
        )
        judge_failed.set_function(lambda: float(gateway.judge_failures()))
        inflight = Gauge("boute_inflight", "requests in progress", registry=r)
        inflight.set_function(lambda: gateway.inflight)
        # re-plan events as the gateway sees them: each plan it adopts (the first at start-up, then every rollout)
        self.plans_applied = Counter(
            "boute_plan_applied", "plans this gateway has adopted (1 at start-up, +1 per re-plan rollout)", registry=r
        )
        self.plan_applied_at = Gauge(
            "boute_plan_applied_timestamp_seconds", "when the plan now served was adopted (Unix time)", registry=r
        )
        # the tolerances the alert rules hold the promise to, published once so the rules carry no copy of them:
        # share (absolute, `boute verify`'s), p95_over (relative) and failed (share of requests, the re-plan
        # detector's), min_requests (a window with fewer judges nothing, the detector's)
        tolerance = Gauge(
            "boute_plan_tolerance",
            "how far served may stray from the promise before alerts fire",
            ["check"],
            registry=r,
        )
        for check, value in tolerances().items():
            tolerance.labels(check).set(value)

    def count(self, tier: str, code: int) -> None:
        key = (tier, code)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.requests.labels(tier, str(code))
        child.inc()

    def observe(self, tier: str, code: int, overhead_s: float) -> None:
        self.count(tier, code)
        self.overhead.observe(overhead_s)

    def served(self, tier: str, seconds: float) -> None:
        """End-to-end latency of a successful request (labelled child cached: one dict lookup)."""
        child = self._latency.get(tier)
        if child is None:
            child = self._latency[tier] = self.latency.labels(tier)
        child.observe(seconds)

    def first_token(self, tier: str, seconds: float) -> None:
        """Time to first token of a streamed request, as its client gets it (the gateway's own clock)."""
        child = self._ttft.get(tier)
        if child is None:
            child = self._ttft[tier] = self.ttft.labels(tier)
        child.observe(seconds)

    def stream_failure(self, tier: str) -> None:
        self.stream_failed.labels(tier).inc()

    def routed(self, tier: str, reason: str, matched_chars: int, prompt_chars: int) -> None:
        """A request placed by the affinity rule (:data:`router.balancer.RouteHook`); children cached."""
        child = self._routed.get((tier, reason))
        if child is None:
            child = self._routed[tier, reason] = self.affinity_routed.labels(tier, reason)
        child.inc()
        chars = self._chars.get(tier)
        if chars is None:
            chars = self._chars[tier] = (self.affinity_matched.labels(tier), self.affinity_hashed.labels(tier))
        chars[0].inc(matched_chars)
        chars[1].inc(prompt_chars)

    def affinity_started(self, tiers: Iterable[str]) -> None:
        """Affinity is in force for ``tiers``: their series start at 0 (why: :meth:`plan`)."""
        from boute.sim.affinity import REASONS

        for tier in tiers:
            for reason in REASONS:
                self._routed.setdefault((tier, reason), self.affinity_routed.labels(tier, reason))
            self._chars.setdefault(tier, (self.affinity_matched.labels(tier), self.affinity_hashed.labels(tier)))

    def usage(self, tier: str, replica: str, body: bytes) -> None:
        """Prompt and cached tokens of an answer (a JSON body or a stream's usage chunk), read by byte search;
        an answer without usage counts nothing, one without ``cached_tokens`` counts 0 cached."""
        prompt = usage_count(body, PROMPT_USAGE)
        if prompt is None:
            return
        pair = self._tokens.get((tier, replica))
        if pair is None:
            pair = self._tokens[tier, replica] = (
                self.prompt_tokens.labels(tier, replica),
                self.cached_tokens.labels(tier, replica),
            )
        pair[0].inc(prompt)
        cached = usage_count(body, CACHED_USAGE)
        if cached:
            pair[1].inc(cached)

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason).inc()

    def plan(self, plan: Plan) -> None:
        """Publish the plan's promise (shares from its fractions; P95 and quality from its prediction) and start
        its tiers' series at 0. Why at 0: Prometheus' rate() and increase() see a series' increments only after
        its first sample, so a child made by its first event hides that event (and a burst between two scrapes,
        whole); labelled series that exist from the start count from the start."""
        self.promised_share.clear()
        for tier, f in zip(plan.routing.tiers, plan.routing.fractions or [], strict=False):
            self.promised_share.labels(tier).set(f)
        for tier in plan.routing.tiers:
            if (tier, 200) not in self._children:
                self._children[tier, 200] = self.requests.labels(tier, "200")
            self._latency.setdefault(tier, self.latency.labels(tier))
            self._ttft.setdefault(tier, self.ttft.labels(tier))
            self.stream_failed.labels(tier)
        self.plans_applied.inc()
        self.plan_applied_at.set_to_current_time()
        pred = plan.predicted
        self.promised_p95.set(pred.p95_latency_s if pred and pred.p95_latency_s is not None else float("nan"))
        self.promised_quality.set(pred.quality if pred and pred.quality is not None else float("nan"))

    def refresh(self) -> None:
        """Set the gauges computed at scrape time: served shares (this process's counts), healthy replicas."""
        ok = {t: c._value.get() for (t, code), c in self._children.items() if code == 200 and t != "-"}
        for t, share in served_shares(ok).items():
            self.served_share.labels(t).set(share)
        for tier, n in self._gateway.healthy_tiers().items():
            self._healthy.labels(tier).set(n)

    def render(self) -> bytes:
        """The exposition text: this process's registry, or, in a worker of several on one port, every worker's
        merged (``fleet``, :class:`router.worker_metrics.WorkerMetrics`)."""
        self.refresh()
        if self.fleet is not None:
            return self.fleet.render()
        return generate_latest(self.registry)


def served_shares(ok: dict[str, float]) -> dict[str, float]:
    """Each tier's share of the successful requests (``ok``: tier -> requests answered 200)."""
    total = sum(ok.values())
    return {t: n / total if total else 0.0 for t, n in ok.items()}
