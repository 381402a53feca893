"""Replay a workload sample through a gateway over real HTTP and score what comes back.

Time compression: with emulated backends running ``speedup`` times faster than modelled, arrivals are sent
``speedup`` times closer together and every measured latency is multiplied by ``speedup``, so latencies
come back in model seconds. What does not scale (the gateway's own overhead, HTTP and this machine's CPU)
is inflated by the same factor; that is the approximation, small while latencies are seconds and
overheads milliseconds.

What is sent is what ``boute verify`` sends (:func:`boute.serving.replay_requests.replay_messages`): a multi-turn query
(MT-Bench turn 2) carries its earlier exchange, so the replica prefills as many tokens as the simulator
counted for it and the live evaluator measures the latency the plan promised.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from boute.quality.profiles import QualityProfile
from boute.serving.replay_requests import replay_messages
from boute.workload import Workload

#: a chat conversation as the gateway takes it: ``{"role": ..., "content": ...}`` messages, the query last
Messages = list[dict[str, str]]

#: what a request with no profile row (``prompt_index == -1``) asks; it asks for its workload output length
NO_PROFILE_PROMPT = "Write a long story."


@dataclass(frozen=True)
class ReplayResult:
    latency_s: np.ndarray  # model seconds per request (nan when it failed)
    tier: list[str | None]  # x-boute-tier of each answer
    text: list[str | None]
    status: np.ndarray  # HTTP status (0 = transport error / timeout)
    wall_s: float  # wall time of the replay

    @property
    def ok(self) -> np.ndarray:
        return self.status == 200


async def _replay(
    base_url: str,
    messages: list[Messages],
    max_tokens: list[int | None],
    send_at: np.ndarray,
    speedup: float,
    timeout_s: float,
) -> ReplayResult:
    import httpx

    n = len(messages)
    lat = np.full(n, np.nan)
    status = np.zeros(n, dtype=np.int64)
    tiers: list[str | None] = [None] * n
    texts: list[str | None] = [None] * n
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits, trust_env=False) as client:
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            delay = t0 + send_at[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body: dict[str, object] = {"model": "boute", "messages": messages[i]}
            if max_tokens[i] is not None:
                body["max_tokens"] = max_tokens[i]
            start = time.perf_counter()
            try:
                r = await client.post("/v1/chat/completions", json=body)
            except httpx.HTTPError:
                return
            status[i] = r.status_code
            if r.status_code == 200:
                lat[i] = (time.perf_counter() - start) * speedup
                tiers[i] = r.headers.get("x-boute-tier")
                texts[i] = r.json()["choices"][0]["message"]["content"]

        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
    return ReplayResult(lat, tiers, texts, status, wall)


def replay_conversations(profile: QualityProfile, prompt_index: np.ndarray) -> list[Messages]:
    """The messages of each request: its profile row's, by the one rule ``boute verify`` replays with
    (:func:`replay_messages`); a request without a row asks :data:`NO_PROFILE_PROMPT`."""
    return [
        replay_messages(profile, int(row)) if row >= 0 else [{"role": "user", "content": NO_PROFILE_PROMPT}]
        for row in prompt_index
    ]


def replay(
    base_url: str, workload: Workload, messages: list[Messages], speedup: float = 1.0, timeout_s: float = 120.0
) -> ReplayResult:
    """Send request i at ``arrival_s[i] / speedup`` (wall) with ``messages[i]`` (:func:`replay_conversations`);
    requests without a profile prompt (``prompt_index == -1``) ask for their workload output length."""
    max_tokens = [
        None if workload.prompt_index[i] >= 0 else int(workload.output_tokens[i]) for i in range(len(messages))
    ]
    send_at = (workload.arrival_s - workload.arrival_s[0]) / speedup
    return asyncio.run(_replay(base_url, messages, max_tokens, send_at, speedup, timeout_s))
