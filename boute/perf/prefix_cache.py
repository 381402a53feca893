"""SGLang's radix prefix cache as a model: which prompt tokens a replica already holds in KV, and so skips.

SGLang keeps the KV of finished (and prefilled) sequences in a radix tree over token ids; a new request
reuses the longest cached prefix of its prompt and prefills only the rest (``RadixCache.match_prefix``).
When the pool runs short it evicts whole leaves, least recently used first (``RadixCache.evict``). This
module is that policy, written once, for the simulator (per simulated replica), the emulated backend (per
process) and the gateway's and evaluators' expectations of hits.

**Paths.** A prompt is given as a *path*: a sequence of segments ``(key, tokens)`` whose keys each name the
segment's content *together with everything before it* (a chained hash, :func:`chained_keys`), so two
prompts share a cached prefix exactly when their paths share leading keys, and one key lookup per
segment replaces a walk over token ids. The emulated backend cuts real token pieces into blocks of
:data:`BLOCK_TOKENS` (its hits are exact up to the last partial block, as SGLang's with ``page_size > 1``);
the simulator's segments are a workload's shared contexts (:mod:`boute.workload.prefixes`: a system prompt, a
conversation's earlier turns), so a hit is counted to the token.

**Eviction, O(1).** The nodes sit in an ordered dict in recency order. Every match or insert touches the
path's nodes from the deepest to the root, so a node is never older than any of its children; the oldest
node is therefore always a leaf, and evicting from the front is exactly "least recently used leaf first".
An evicted node's subtree is already gone (its children were older), so nothing dangles.

**What is approximate.** SGLang locks the nodes of running requests against eviction and shares one pool
between the cache and running requests; here the cache is held to a token budget that the caller sets
(the simulator: the pool less what its running requests reserve, :meth:`PrefixCache.limit`), and a running
request's prefix may be evicted under pressure. The last prompt token is never a hit: SGLang computes
it to get the first answer token's logits (``match`` caps at ``prompt_tokens - 1``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

#: tokens per segment when a real token sequence is cut into a path (SGLang's CPU default is 1; a block
#: of 16 keeps a 3,000-token prompt to ~190 dict operations, at most 15 tokens of hit lost per prompt)
BLOCK_TOKENS = 16

Segment = tuple[Hashable, int]


@dataclass(slots=True)
class _Node:
    parent: Hashable | None
    tokens: int


def chained_keys(blocks: Iterable[str], seed: bytes = b"") -> list[bytes]:
    """One key per block naming it and every block before it: ``k_i = H(k_{i-1} || len || block_i)``
    (BLAKE2b, 8 bytes: stable across processes and gateways, unlike ``hash()`` of a str)."""
    out: list[bytes] = []
    prev = seed
    for block in blocks:
        data = block.encode()
        prev = hashlib.blake2b(prev + len(data).to_bytes(4, "little") + data, digest_size=8).digest()
        out.append(prev)
    return out


def token_path(pieces: Sequence[str], block_tokens: int = BLOCK_TOKENS) -> list[Segment]:
    """The path of a prompt given as its token pieces (:func:`boute.workload.tokens.token_pieces`): one
    segment per ``block_tokens`` tokens, the last one possibly shorter."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    cuts = range(0, len(pieces), block_tokens)
    blocks = ["\x00".join(pieces[a : a + block_tokens]) for a in cuts]
    keys = chained_keys(blocks)
    return [(k, min(block_tokens, len(pieces) - a)) for k, a in zip(keys, cuts, strict=True)]


class PrefixCache:
    """A token-budgeted radix cache with LRU leaf eviction over paths of chained-key segments.

    ``capacity_tokens`` bounds the tokens held (the sum of held segments' tokens); :meth:`limit` lowers or
    raises it later. ``hit_tokens`` / ``lookup_tokens`` count what :meth:`match` found against what it was
    asked, so ``hit_tokens / lookup_tokens`` is the cached-token share of the prompts served.
    """

    __slots__ = ("capacity", "held", "nodes", "hit_tokens", "lookup_tokens", "evicted_tokens")

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        self.capacity = int(capacity_tokens)
        self.held = 0
        self.nodes: OrderedDict[Hashable, _Node] = OrderedDict()
        self.hit_tokens = 0
        self.lookup_tokens = 0
        self.evicted_tokens = 0

    def __len__(self) -> int:
        return len(self.nodes)

    def peek(self, path: Sequence[Segment], prompt_tokens: int | None = None) -> int:
        """Tokens of the longest cached leading run of ``path``, capped at ``prompt_tokens - 1``; touches
        and counts nothing (what a router may ask before it chooses)."""
        nodes, got = self.nodes, 0
        for key, tokens in path:
            if key not in nodes:
                break
            got += tokens
        total = sum(t for _, t in path) if prompt_tokens is None else prompt_tokens
        return max(0, min(got, total - 1))

    def match(self, path: Sequence[Segment], prompt_tokens: int | None = None) -> int:
        """Like :meth:`peek`, and the matched nodes become the most recently used; counted in the stats.

        ``prompt_tokens`` defaults to the path's own tokens."""
        nodes = self.nodes
        depth = 0
        for key, _ in path:
            if key not in nodes:
                break
            depth += 1
        self._touch(path, depth)
        total = sum(t for _, t in path) if prompt_tokens is None else prompt_tokens
        got = max(0, min(sum(t for _, t in path[:depth]), total - 1))
        self.hit_tokens += got
        self.lookup_tokens += max(0, total)
        return got

    def insert(self, path: Sequence[Segment]) -> None:
        """Hold every segment of ``path`` (new ones at its end), most recent first, then evict to budget."""
        nodes = self.nodes
        parent: Hashable | None = None
        for key, tokens in path:
            if key not in nodes:
                nodes[key] = _Node(parent, int(tokens))
                self.held += int(tokens)
            parent = key
        self._touch(path, len(path))
        self._evict()

    def limit(self, capacity_tokens: int) -> None:
        """Set the token budget (negative counts as 0) and evict down to it."""
        self.capacity = max(0, int(capacity_tokens))
        self._evict()

    def _touch(self, path: Sequence[Segment], depth: int) -> None:
        move = self.nodes.move_to_end
        for i in range(depth - 1, -1, -1):  # deepest first: a parent ends up newer than its children
            move(path[i][0])

    def _evict(self) -> None:
        nodes = self.nodes
        while self.held > self.capacity and nodes:
            _, node = nodes.popitem(last=False)  # the oldest node, always a leaf (module docstring)
            self.held -= node.tokens
            self.evicted_tokens += node.tokens
