"""Expected prefix-cache hits of a plan's tiers in closed form: the fast path's view of the replicas' caches.

The simulator runs each replica's radix cache (:mod:`boute.perf.prefix_cache`) request by request; the fast
path (:func:`boute.sim.fast_evaluate`, milliseconds a plan) cannot, so it charges each tier's prompts less the
share of their tokens this module expects to hit.

**Model.** A request's prompt is a path of segments (:mod:`boute.workload.prefixes`): a system prompt, earlier
turns and their answers, its own question. A replica holds segment ``s`` once a request whose path runs
through ``s`` ran on it (it prefilled ``s``) or generated ``s`` (an answer, keyed by the tier that gave it, as
:class:`~boute.workload.prefixes.Paths` keys it). Let ``m`` be the number of such requests that arrived before
this one on the same tier. Then, with ``R`` replicas in the tier:

- *least load*: each of them landed on one replica, about uniformly, so ``P(s held) = 1 - (1 - 1/R)^m``;
- *prefix affinity* (:mod:`boute.sim.affinity`): a prefix goes where it went before, so ``P(s held) = [m >= 1]``.

A request holding ``s`` holds every segment before it, so the matched prefix reaches the end of ``s`` exactly
when the replica holds ``s``: ``E[hit tokens] = sum_s tokens(s) P(s held)``, at most the prompt less its last
token (an engine prefills at least one). A tier's hit share is its requests' expected hit tokens over their
prompt tokens; in a cascade every hop a request reaches prefills it (and generates its answer) on that tier.

**Approximate, stated plainly.** No eviction (each replica's KV pool is taken to hold what the run shares);
requests of one prefix in flight together both miss on real engines, here the later one hits; affinity's
yielding to load (imbalance, a holder at its bounded load) is ignored (it always keeps a prefix together);
replicas of unequal capacity count as equal in ``R``. ``python -m bench expected_hits`` measures the estimate against the
simulator's cached share on random plans.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boute.workload.prefixes import Prefixes

#: the relative step of :func:`miss_grid`
MISS_STEP = 1.2


def miss_grid(hit_share: np.ndarray) -> np.ndarray:
    """``1 - hit_share`` rounded on a geometric grid of :data:`MISS_STEP` steps (at most 10% off the prefilled
    tokens). Why: the fast path caches its load curves per prompt length (:mod:`boute.sim.load_curves`), and a
    length shortened by each plan's own share would miss that cache on nearly every plan (7 ms a curve); on
    the grid, plans of near-equal shares share their curves."""
    miss = np.clip(1.0 - np.asarray(hit_share, dtype=float), 1e-4, 1.0)
    return np.minimum(MISS_STEP ** np.round(np.log(miss) / np.log(MISS_STEP)), 1.0)


@dataclass(frozen=True)
class _Events:
    """A workload's segment events, built once, sorted by (segment, request, look before put): each request
    looks up the segments of its prompt, then leaves them in the cache, and its answer after them."""

    req: np.ndarray  # int64 per event: the request
    put: np.ndarray  # bool: leaves the segment (else looks it up)
    answer: np.ndarray  # bool: a request leaving its own answer (content of the tier that generates it)
    tokens: np.ndarray  # float64: the segment's tokens
    before_group: np.ndarray  # int64: index of the first event of the same segment
    prompt_tokens: np.ndarray  # float64 per request


def _events(p: Prefixes, input_tokens: np.ndarray) -> _Events:
    n = len(p.prompt_node)
    reqs: list[int] = []
    nodes: list[int] = []
    path_of: dict[int, list[int]] = {}
    for i in range(n):
        last = int(p.prompt_node[i])
        path = path_of.get(last)
        if path is None:
            path, cur = [], last
            while cur >= 0:
                path.append(cur)
                cur = int(p.parent[cur])
            path_of[last] = path
        reqs.extend([i] * len(path))
        nodes.extend(path)
    look_req, look_node = np.asarray(reqs, dtype=np.int64), np.asarray(nodes, dtype=np.int64)
    answered = np.flatnonzero(p.answer_node >= 0)
    k = len(look_req)
    req = np.concatenate([look_req, look_req, answered])
    node = np.concatenate([look_node, look_node, p.answer_node[answered]])
    put = np.r_[np.zeros(k, bool), np.ones(k + len(answered), bool)]
    answer = np.r_[np.zeros(2 * k, bool), np.ones(len(answered), bool)]
    order = np.argsort((node * n + req) * 2 + put, kind="stable")
    node = node[order]
    first = np.r_[0, np.flatnonzero(node[1:] != node[:-1]) + 1]
    return _Events(
        req=req[order],
        put=put[order],
        answer=answer[order],
        tokens=p.tokens[node].astype(float),
        before_group=np.repeat(first, np.diff(np.r_[first, len(node)])),
        prompt_tokens=np.asarray(input_tokens, dtype=float),
    )


class ExpectedHits:
    """Per tier, the share of its prompt tokens a plan's replicas are expected to serve from cache (module doc).

    Built once per workload (the segment events, sorted); each plan costs a few vector passes per tier."""

    def __init__(self, prefixes: Prefixes, input_tokens: np.ndarray, n_tiers: int) -> None:
        self.ev = _events(prefixes, input_tokens)
        self.n_tiers = n_tiers

    def shares(self, final_tier: np.ndarray, replicas: list[int], affinity: bool, cascade: bool) -> np.ndarray:
        """Expected hit share of each tier's prompt tokens (0 for a tier without requests); arguments as
        :meth:`tokens`."""
        hit, prompt = self.tokens(final_tier, replicas, affinity, cascade)
        return np.divide(hit, prompt, out=np.zeros(self.n_tiers), where=prompt > 0)

    def tokens(
        self, final_tier: np.ndarray, replicas: list[int], affinity: bool, cascade: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per tier, the expected hit tokens and the prompt tokens its replicas prefill or look up.

        ``final_tier``: the tier that answers each request (pre-routing: the one it is sent to; cascade: the
        last hop it reaches, every earlier tier having prefilled it too); ``replicas``: per tier, its replica
        count (a tier without replicas hits nothing)."""
        return self.tokens_of(self.holders(final_tier, cascade), replicas, affinity)

    def holders(self, final_tier: np.ndarray, cascade: bool) -> Holders:
        """What a routing leaves in each tier's caches: per tier, the looks and their earlier holders ``m``.

        Per tier ``k``, over the sorted events: a put counts where its request visits ``k``, and an answer put
        only where ``k`` is the tier whose answer the client got (a later turn repeats that text; the other
        hops' answers are other text). A look's ``m`` is the count of such puts before it in its segment's
        run of events, which holds the earlier requests only (a request's look sorts before its own put).
        It depends on the routing alone, not on the replicas: callers reuse it across plans of one routing."""
        ev = self.ev
        route = np.asarray(final_tier, dtype=np.int64)
        tiers = np.arange(self.n_tiers)
        visits = tiers[None, :] <= route[:, None] if cascade else tiers[None, :] == route[:, None]
        ev_route = route[ev.req]
        per_tier = []
        for k in range(self.n_tiers):
            on_k = visits[ev.req, k]
            put = ev.put & on_k & (~ev.answer | (ev_route == k))
            cum = np.cumsum(put)
            m = cum - np.r_[0, cum][ev.before_group]  # puts before this event in its segment's run
            look = np.flatnonzero(on_k & ~ev.put)
            per_tier.append((ev.req[look], ev.tokens[look], m[look]))
        prompt = ev.prompt_tokens[:, None] * visits
        return Holders(tuple(per_tier), prompt)

    def tokens_of(self, h: Holders, replicas: list[int], affinity: bool) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`tokens` from a routing's :meth:`holders`."""
        n = len(self.ev.prompt_tokens)
        hit = np.zeros((n, self.n_tiers))
        for k, (req, tokens, m) in enumerate(h.looks):
            if replicas[k] <= 0:
                continue
            held = (m >= 1).astype(float) if affinity else 1.0 - (1.0 - 1.0 / replicas[k]) ** m
            hit[:, k] = np.bincount(req, tokens * held, minlength=n)
        hit = np.minimum(hit, np.maximum(h.prompt - 1.0, 0.0))  # an engine prefills at least the last token
        return hit.sum(axis=0), h.prompt.sum(axis=0)


@dataclass(frozen=True)
class Holders:
    """A routing's looks per tier, ``(request, tokens, earlier holders m)`` arrays, and the (requests, tiers)
    prompt tokens each tier prefills or looks up (:meth:`ExpectedHits.holders`)."""

    looks: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]
    prompt: np.ndarray
