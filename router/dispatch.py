"""Sending an admitted request on: to the one tier it was routed to, or down the cascade.

Kept apart from the gateway's admission and accounting (:mod:`router.gateway`): these steps only talk to the
replicas (:class:`router.proxy.Proxy`) and the judge, and say what answered and how long the request waited on
them, which is what the gateway's ``x-boute-overhead-ms`` subtracts from its handler's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from boute.quality.judges import JudgeFailed
from boute.serving.reason import CASCADE
from router.openai_io import CHAT, response_text
from router.proxy import Proxy, Result, Stream
from router.routing import RoutePolicy

if TYPE_CHECKING:  # boute.sim loads on the first plan, not with the gateway's imports
    from boute.sim.affinity import PromptKeys

#: the replicas' path for each request kind
PATHS = {CHAT: "/v1/chat/completions", "completion": "/v1/completions"}


class Dispatched(NamedTuple):
    """What the tier a request was sent to (or the cascade) answered. Immutable and built once a request: a
    NamedTuple (~0.24 us to build here) rather than a frozen dataclass (~0.53 us with slots)."""

    #: the replica's answer: whole, or a stream whose first chunk has arrived
    answer: Result | Stream
    #: index of the tier that answered
    tier: int
    #: seconds spent waiting on replicas and judges (the request's time outside the gateway itself)
    waited_s: float
    #: tiers asked: 1, or up to the number of tiers for a cascade that escalated
    hops: int
    #: a cascade's route reason, every hop's verdict (:mod:`boute.serving.reason`); "" for one tier asked, whose
    #: reason the caller writes from the score it routed by
    reason: str = ""


async def send_single(
    proxy: Proxy,
    policy: RoutePolicy,
    tier: int,
    kind: str,
    body: dict[str, Any],
    stream: bool,
    keys: PromptKeys | None = None,
) -> Dispatched:
    """Tier ``tier`` answers (a stream once its first chunk is in, or whole); ``keys``: the prompt's prefix
    keys, for the replica's choice (None: least load)."""
    name = policy.tiers[tier]
    if stream:
        out: Stream | Result = await proxy.open_stream(name, PATHS[kind], body, keys)
    else:
        out = await proxy.complete(name, PATHS[kind], body, keys)
    return Dispatched(out, tier, out.upstream_s, 1)


async def send_cascade(
    proxy: Proxy,
    policy: RoutePolicy,
    kind: str,
    body: dict[str, Any],
    prompt: str,
    stream: bool,
    keys: PromptKeys | None = None,
    escalated: Callable[[], None] | None = None,
) -> Dispatched:
    """Tier 0 answers; the judge scores it; below the hop's threshold the next tier answers (``escalated`` is
    called at each such hop). Earlier hops are asked whole, for the judge; only the last tier streams."""
    last = len(policy.tiers) - 1
    waited = 0.0
    # earlier hops are asked whole, for the judge, and without stream_options: servers that check it (vLLM)
    # refuse it on a request that does not stream
    inner = ({k: v for k, v in body.items() if k != "stream_options"} | {"stream": False}) if stream else body
    judge, reasons = policy.judge, policy.reasons
    assert judge is not None  # a cascade policy always has a judge
    why = CASCADE  # each hop's verdict is appended (boute.serving.reason)
    for hop in range(last + 1):
        name = policy.tiers[hop]
        if hop == last and stream:
            out = await proxy.open_stream(name, PATHS[kind], body, keys)
            return Dispatched(out, hop, waited + out.upstream_s, hop + 1, why + reasons.final(hop))
        res = await proxy.complete(name, PATHS[kind], inner, keys)
        waited += res.upstream_s
        if hop == last or res.status != 200:
            end = reasons.final(hop) if hop == last else reasons.unjudged(hop, res.status)
            return Dispatched(res, hop, waited, hop + 1, why + end)
        t = time.perf_counter()
        score = await judge.ajudge(prompt, response_text(res.body, kind))
        waited += time.perf_counter() - t
        if policy.accepts(hop, score):
            return Dispatched(res, hop, waited, hop + 1, why + reasons.accepted(hop, score))
        why += reasons.escalated(hop, score, type(score) is JudgeFailed)
        if escalated is not None:
            escalated()
    raise AssertionError("unreachable")
