"""What the gateways served, interval by interval, and the rolling window merged across instances.

Each gateway instance keeps, per interval (a few seconds), counts and small uniform samples of what it
served: prompt length (characters: the gateway sees text, not tokens), answer length (the backend's
``usage.completion_tokens``), router score, per-tier latency and failures, and its healthy replicas per
replica group. It pushes the interval as a :class:`Snapshot` onto a capped Redis list
(``RedisKeys.observations``); anyone (``boute replan``, ``boute status``) merges the snapshots of the
last seconds into a :class:`Window`. Samples are uniform within an interval (reservoir), so merging
intervals by their request counts keeps a window's sample representative without storing every request.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from boute.stats import quantile

#: values kept per interval and quantity: enough for a two-sample test over a window of many intervals
SAMPLE = 256
#: snapshots kept in Redis (per prefix, all instances): an hour of 5 s intervals from a few instances
KEEP = 4096


@dataclass(frozen=True)
class TierStats:
    served: int = 0
    failed: int = 0
    latency_s: list[float] = field(default_factory=list)  # sample of successful requests' latencies


@dataclass(frozen=True)
class Snapshot:
    """One gateway instance over ``[t0, t1)`` (epoch seconds)."""

    instance: str
    t0: float
    t1: float
    requests: int
    prompt_chars: list[int]
    answer_tokens: list[int]
    scores: list[float]
    tiers: dict[str, TierStats]
    healthy: dict[str, int]  # replica group (tier/gpu/tpXppY) -> healthy replicas at t1

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Snapshot:
        d = json.loads(raw)
        d["tiers"] = {k: TierStats(**v) for k, v in d["tiers"].items()}
        return cls(**d)


class Reservoir:
    """A uniform sample of at most ``k`` values from a stream (Vitter's algorithm R): O(1) per value."""

    __slots__ = ("k", "n", "values", "_rng")

    def __init__(self, k: int = SAMPLE, seed: int | None = None) -> None:
        self.k, self.n = k, 0
        self.values: list[float] = []
        self._rng = random.Random(seed)

    def add(self, v: float) -> None:
        self.n += 1
        if len(self.values) < self.k:
            self.values.append(v)
        else:
            j = self._rng.randrange(self.n)
            if j < self.k:
                self.values[j] = v


def group_key(tier: str, gpu: str | None, tp: int, pp: int) -> str:
    """The replica group a backend belongs to, as in the plan's deployment (a tier runs one model)."""
    return f"{tier}/{gpu or '?'}/tp{tp}pp{pp}"


@dataclass(frozen=True)
class Window:
    """Snapshots merged over the last ``span_s`` seconds (all instances)."""

    span_s: float
    requests: int
    rate_rps: float
    prompt_chars: np.ndarray
    answer_tokens: np.ndarray
    scores: np.ndarray
    tier_served: dict[str, int]
    tier_failed: dict[str, int]
    tier_p95_s: dict[str, float]
    p95_s: float
    healthy: dict[str, int]
    instances: int

    @property
    def failed(self) -> int:
        """Requests shed (429) or failed in the window, all tiers."""
        return sum(self.tier_failed.values())

    @property
    def failed_share(self) -> float:
        """``failed`` over the window's requests (0 for an empty window)."""
        return self.failed / self.requests if self.requests else 0.0

    def summary(self) -> dict[str, Any]:
        def mean(a: np.ndarray) -> float | None:
            return float(a.mean()) if a.size else None

        return {
            "span_s": self.span_s,
            "requests": self.requests,
            "rate_rps": round(self.rate_rps, 3),
            "mean_prompt_chars": mean(self.prompt_chars),
            "mean_answer_tokens": mean(self.answer_tokens),
            "mean_score": mean(self.scores),
            "tier_served": self.tier_served,
            "tier_failed": self.tier_failed,
            "tier_p95_s": self.tier_p95_s,
            "p95_s": self.p95_s,
            "healthy": self.healthy,
            "instances": self.instances,
        }


def _weighted_sample(
    parts: Sequence[tuple[list[float] | list[int], int]], k: int, rng: np.random.Generator
) -> np.ndarray:
    """Draw ``k`` values from per-interval samples, each interval in proportion to its request count."""
    arrays = [(np.asarray(v, dtype=float), n) for v, n in parts if len(v) and n > 0]
    if not arrays:
        return np.zeros(0)
    weights = np.concatenate([np.full(len(v), n / len(v)) for v, n in arrays])
    values = np.concatenate([v for v, _ in arrays])
    take = min(k, int(sum(n for _, n in arrays)))
    return rng.choice(values, size=take, replace=True, p=weights / weights.sum())


def merge(snapshots: Iterable[Snapshot], now: float, span_s: float, seed: int = 0) -> Window:
    """The window ``[now - span_s, now)`` from the snapshots that end inside it."""
    snaps = [s for s in snapshots if now - span_s <= s.t1 <= now]
    rng = np.random.default_rng(seed)
    requests = sum(s.requests for s in snaps)
    covered = (max(s.t1 for s in snaps) - min(s.t0 for s in snaps)) if snaps else span_s
    instances = {s.instance for s in snaps}
    # rate: each instance's requests over the time it covered, summed over instances
    rate = 0.0
    for inst in instances:
        mine = [s for s in snaps if s.instance == inst]
        span = max(s.t1 for s in mine) - min(s.t0 for s in mine)
        rate += sum(s.requests for s in mine) / max(span, 1e-9)
    k = SAMPLE * 8
    served: dict[str, int] = {}
    failed: dict[str, int] = {}
    lat_parts: dict[str, list[tuple[list[float], int]]] = {}
    for s in snaps:
        for tier, ts in s.tiers.items():
            served[tier] = served.get(tier, 0) + ts.served
            failed[tier] = failed.get(tier, 0) + ts.failed
            lat_parts.setdefault(tier, []).append((ts.latency_s, ts.served))
    tier_lat = {t: _weighted_sample(parts, k, rng) for t, parts in lat_parts.items()}
    all_lat = _weighted_sample([p for parts in lat_parts.values() for p in parts], k, rng)
    latest: dict[str, Snapshot] = {}
    for s in snaps:
        if s.instance not in latest or s.t1 > latest[s.instance].t1:
            latest[s.instance] = s
    healthy: dict[str, int] = {}
    for s in latest.values():  # instances see the same replicas: the most optimistic view of each group
        for g, n in s.healthy.items():
            healthy[g] = max(healthy.get(g, 0), n)
    return Window(
        span_s=float(covered),
        requests=requests,
        rate_rps=rate,
        prompt_chars=_weighted_sample([(s.prompt_chars, s.requests) for s in snaps], k, rng),
        answer_tokens=_weighted_sample([(s.answer_tokens, s.requests) for s in snaps], k, rng),
        scores=_weighted_sample([(s.scores, s.requests) for s in snaps], k, rng),
        tier_served=served,
        tier_failed=failed,
        tier_p95_s={t: quantile(v, 0.95) for t, v in tier_lat.items() if v.size},
        p95_s=quantile(all_lat, 0.95),
        healthy=healthy,
        instances=len(instances),
    )


def read_snapshots(redis_url: str, key: str) -> list[Snapshot]:
    """Every snapshot the gateways pushed under ``key`` (newest first); unreadable entries are skipped."""
    import redis

    from boute.errors import BouteError

    try:
        with redis.Redis.from_url(redis_url, socket_connect_timeout=2.0, socket_timeout=5.0) as r:
            raw = r.lrange(key, 0, KEEP - 1)
    except redis.RedisError as exc:
        raise BouteError(f"observations: Redis at {redis_url} did not answer ({exc})") from None
    out = []
    for item in raw:
        try:
            out.append(Snapshot.from_json(item))
        except (ValueError, TypeError, KeyError):
            continue
    return out
