"""The gateway's side of online re-planning: record what is served, push it to Redis each interval.

The hot path pays a few counter increments and reservoir updates per request (no I/O, no locks: one
event loop). A background task closes the interval every ``observe_interval_s``, turns it into a
:class:`boute.replan.window.Snapshot` and pushes it onto the capped list ``<prefix>:observations`` that
``boute replan`` and ``boute status`` read; without Redis the snapshots stay in memory (last hour).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import time
from collections.abc import Callable

from boute.replan.window import KEEP, Reservoir, Snapshot, TierStats, group_key
from router.balancer import Balancer

log = logging.getLogger("boute.router.observe")


class Observer:
    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self.instance = f"{socket.gethostname()}-{os.getpid()}"
        self.local: collections.deque[Snapshot] = collections.deque(maxlen=int(3600 / max(interval_s, 0.1)))
        self._reset(time.time())

    def _reset(self, now: float) -> None:
        self.t0 = now
        self.requests = 0
        self.prompt_chars = Reservoir()
        self.answer_tokens = Reservoir()
        self.scores = Reservoir()
        self.served: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.latency: dict[str, Reservoir] = {}

    # ---- hot path ---------------------------------------------------------------------------
    def arrival(self, prompt: str, score: float | None) -> None:
        self.requests += 1
        self.prompt_chars.add(len(prompt))
        if score is not None:
            self.scores.add(score)

    def done(self, tier: str, ok: bool, latency_s: float, answer_tokens: int | None) -> None:
        if ok:
            self.served[tier] = self.served.get(tier, 0) + 1
            res = self.latency.get(tier)
            if res is None:
                res = self.latency[tier] = Reservoir()
            res.add(latency_s)
            if answer_tokens is not None:
                self.answer_tokens.add(answer_tokens)
        else:
            self.failed[tier] = self.failed.get(tier, 0) + 1

    # ---- each interval ----------------------------------------------------------------------
    def close(self, healthy: dict[str, int], now: float | None = None) -> Snapshot:
        now = time.time() if now is None else now
        tiers = {
            t: TierStats(
                self.served.get(t, 0), self.failed.get(t, 0), list(self.latency[t].values) if t in self.latency else []
            )
            for t in set(self.served) | set(self.failed)
        }
        snap = Snapshot(
            instance=self.instance,
            t0=self.t0,
            t1=now,
            requests=self.requests,
            prompt_chars=[int(v) for v in self.prompt_chars.values],
            answer_tokens=[int(v) for v in self.answer_tokens.values],
            scores=[float(v) for v in self.scores.values],
            tiers=tiers,
            healthy=healthy,
        )
        self.local.append(snap)
        self._reset(now)
        return snap

    async def run(self, healthy: Callable[[], dict[str, int]], redis_url: str | None, key: str) -> None:
        """Close an interval every ``interval_s`` and push it (``healthy()``: replica group -> count)."""
        r = None
        if redis_url is not None:
            import redis.asyncio as aioredis

            r = aioredis.from_url(redis_url, socket_connect_timeout=1.0, socket_timeout=2.0)
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                snap = self.close(healthy())
                if r is None:
                    continue
                try:
                    async with r.pipeline(transaction=False) as pipe:
                        pipe.lpush(key, snap.to_json())
                        pipe.ltrim(key, 0, KEEP - 1)
                        await pipe.execute()
                except Exception as exc:  # shared store down: observations are best effort
                    log.debug("observations not pushed: %s", exc)
        finally:
            if r is not None:
                await r.aclose()


def healthy_groups(balancer: Balancer) -> dict[str, int]:
    """Healthy replicas per replica group, from the balancer's view."""
    now = time.monotonic()
    out: dict[str, int] = {}
    for reps in balancer.pools.values():
        for r in reps:
            s = r.spec
            key = group_key(s.tier, s.gpu, s.tp, s.pp)
            out[key] = out.get(key, 0) + int(r.available(now))
    return out


_ANSWER_USAGE = b'"completion_tokens":'
#: ``usage.prompt_tokens`` as it appears in a JSON answer or a stream's usage chunk
PROMPT_USAGE = b'"prompt_tokens":'
CACHED_USAGE = b'"cached_tokens":'


def answer_tokens(body: bytes) -> int | None:
    """``usage.completion_tokens`` of an OpenAI JSON answer, read without parsing the body (a byte search:
    the hot path forwards bodies untouched)."""
    return usage_count(body, _ANSWER_USAGE)


def usage_count(body: bytes, field: bytes) -> int | None:
    """The integer after the last ``field`` (``b'"name":'``) in ``body``, None where there is none: a usage
    figure read by a byte search from the end, where OpenAI answers put ``usage``."""
    i = body.rfind(field)
    if i < 0:
        return None
    j = i + len(field)
    while j < len(body) and body[j] in b" \t":
        j += 1
    k = j
    while k < len(body) and 48 <= body[k] <= 57:
        k += 1
    return int(body[j:k]) if k > j else None
