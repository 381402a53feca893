"""Cache-aware (prefix-affinity) balancing within a tier, bounded by load: the rule, written once.

Why: an SGLang replica keeps the KV of the prompts it served in a radix cache (:mod:`boute.perf.prefix_cache`),
so a request whose prompt shares a long prefix with an earlier one (a shared system prompt; turn 2 of a
conversation repeats turn 1 and its answer) prefills only the rest on the replica that served that prefix.
Least load alone scatters such requests and every replica pays every prefix again. This is sglang-router's
(smg) cache-aware policy, stated for replicas of unequal capacity: the gateway applies it
(:mod:`router.balancer`), and the simulator can apply the same rule to its replicas.

**Keys.** The prompt text as sent (chat: :func:`render_messages`, role and content of every message in order)
is cut into blocks of ``b`` = ``block_chars`` characters; only the first ``max_blocks`` are kept, so a request
costs at most ``max_blocks`` hashes whatever its length. Block ``i``'s key names it and every block before it
(:func:`boute.perf.prefix_cache.chained_keys`, BLAKE2b: the same in every process, so independent gateways
compute the same keys), hence two prompts share their first ``d`` keys exactly when they share their first
``d`` blocks.

**Index.** Per tier, an approximate radix index: key -> the (at most :data:`PER_KEY`) replicas that most
recently served a prompt through that block, least recently used keys forgotten beyond ``index_blocks``.
Recording touches a prompt's keys deepest first, so a block is never older than its descendants and eviction
takes leaves first; hence a prompt's matched blocks are a leading run and the walk stops at the first miss:
the longest match ``d_r`` of every replica ``r`` in O(blocks x PER_KEY). A replica taken out (failed, marked
down, removed) is forgotten in O(1): each entry carries the replica's generation at the time it was recorded,
and :meth:`AffinityIndex.forget` moves the generation on.

**Choice.** Among the tier's available replicas ``r`` with ``o_r`` outstanding requests and capacity weight
``w_r`` (the least-load rule's, :class:`boute.specs.plan.Balance`), load ``L_r = o_r / w_r``:

1. *imbalance*: when ``max L - min L > balance_abs`` and ``max L > balance_rel * min L`` (both, as smg), least
   load decides (the caller's rule: the fewest ``(o_r + 1) / w_r``);
2. *new_prefix*: when no replica holds even the first block (``D = max d_r = 0``), weighted rendezvous
   (highest-random-weight) hashing of the first block: score ``s_r = -w_r / ln u_r`` with ``u_r`` in (0, 1)
   a hash of (first key, replica id), so ``P[r wins] = w_r / W`` and removing a replica moves only the prefixes
   it won; every gateway computes the same winner without sharing state. Bounded load (consistent hashing
   with bounded loads, Mirrokni, Thorup & Zadimoghaddam 2018): replicas are taken in score order and the first
   with ``o_r + 1 <= ceil(c (O + 1) w_r / W)`` wins, ``O = sum o``, ``c = balance_rel``; since
   ``sum_r ceil(c (O + 1) w_r / W) >= c (O + 1) > O``, one always qualifies, and a hot new prefix spills to
   its next choice instead of piling onto one replica;
3. *short_match*: when the ``D`` matched blocks cover less than ``min_match`` of the hashed characters, least
   load decides;
4. *affinity*: otherwise the replica with ``d_r = D``, ties to the fewest ``(o_r + 1) / w_r``, within the same
   bounded load as 2 with one request of slack: replicas are taken deepest match first (ties: fewest
   ``(o_r + 1) / w_r``) and the first with ``o_r <= ceil(c (O + 1) w_r / W)`` wins; where that is not one of
   the deepest, the reason is *bounded*. So no replica holds more than ``ceil(c (O + 1) w_r / W) + 1``
   however popular its prefixes: a hot system prompt spreads to a second replica (which then holds it too)
   instead of piling up, and a replica added to the tier takes the overflow. The slack keeps a closed loop of
   a request or two per replica where it is (without it, a holder with one request in flight while the rest
   of the tier is idle is already beyond ``ceil(c (O + 1) w_r / W)`` and would pass its prefixes around).

Whichever rule chose, the chosen replica is recorded for all the prompt's keys.

**In the simulator** (:mod:`boute.sim.balance`), prompts are paths of token segments
(:mod:`boute.workload.prefixes`), not text, so :func:`path_keys` derives the keys the gateway would see: blocks
of ``B = block_chars / CHARS_PER_TOKEN`` tokens (:func:`block_tokens`), block ``i`` named by where it ends,
``(segment key, offset)``: the key of the segment holding the block's last token and the tokens into it. A
segment's key names its whole path from the root (a node id; an answer's ``(node, tier)``: equal keys, equal
content, :class:`boute.workload.prefixes.Paths`), so that pair names every token before it as the chained
hash names every character before it: two prompts share their first ``d`` keys exactly when they share their
first ``min(d B, length)`` tokens, as two texts share their first ``d`` keys exactly when they share their
first ``d`` blocks. A prompt's last, short block ends inside its own segment, so a longer prompt through it
(a conversation's next turn) matches only its full blocks, as with text.

**Cost.** Hashing is ~0.7 us per block (BLAKE2b), matching and recording ~0.3 us per block over a fixed
~7 us for the choice among the replicas. Rendering, keys and the pick together (``python -m bench affinity``:
8 replicas, a warm index, a 2-core host at load ~3): ~12 us for a 500-character chat, ~20 us for 2,000
characters, ~47 us at the default bound of 32 blocks, whatever the prompt's length beyond (least load alone:
~1.2 us).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from boute.perf.prefix_cache import Segment, chained_keys
from boute.specs.balancing import Affinity

#: why a request went to its replica: by its prefix, a new prefix's rendezvous choice, or least load because
#: the tier was imbalanced or the match too short (the gateway's ``boute_affinity_routed{reason}``)
AFFINITY, NEW_PREFIX, IMBALANCE, SHORT_MATCH = "affinity", "new_prefix", "imbalance", "short_match"
#: the replicas holding the longest match were at their bounded load: the next-longest match within its bound
BOUNDED = "bounded"
REASONS = (AFFINITY, NEW_PREFIX, IMBALANCE, SHORT_MATCH, BOUNDED)
#: replicas remembered per block, most recent last: a prefix replicated by load fallbacks stays on a few
#: replicas, and matching stays O(blocks x PER_KEY)
PER_KEY = 4
#: separators of :func:`render_messages` (ASCII unit / record separators: never typed in a prompt)
_AFTER_ROLE, _AFTER_MESSAGE = "\x1f", "\x1e"
_TWO_64 = float(1 << 64)
#: characters per prompt token, to cut the simulator's token segments into the gateway's character blocks:
#: the token counter the workloads are measured with (WordPiece, :mod:`boute.workload.tokens`) lands near 1.3
#: tokens per English word of ~4.5 letters and a space, i.e. ~4.2 characters per token; 4 is the figure the
#: emulated backend writes its text at (``backends.emulated.profile.CHARS_PER_TOKEN``), so the default 256
#: character block is 64 tokens in both
CHARS_PER_TOKEN = 4


def render_messages(messages: Iterable[tuple[str, str]], limit: int) -> str:
    """Chat messages (role, text) as one canonical text, at most ``limit`` characters: ``role US text RS`` per
    message, in order. Why the role too: the same words as a system prompt and as a user turn are different
    prompts to the model's chat template, so they must not share keys."""
    parts: list[str] = []
    n = 0
    for role, text in messages:
        parts += (role, _AFTER_ROLE, text, _AFTER_MESSAGE)
        n += len(role) + len(text) + 2
        if n >= limit:
            break
    return "".join(parts)[:limit]


class PromptKeys(NamedTuple):
    """A prompt's chained block keys and the characters they cover (at most ``block_chars x max_blocks``)."""

    keys: list[bytes]
    chars: int


class Route(NamedTuple):
    """What the rule chose: a candidate's position, or None where least load decides; why; characters matched."""

    choice: int | None
    reason: str
    matched_chars: int


def prompt_keys(text: str, settings: Affinity) -> PromptKeys:
    """The keys of ``text``'s first ``max_blocks`` blocks of ``block_chars`` characters (the last may be short)."""
    b = settings.block_chars
    head = text[: b * settings.max_blocks]
    return PromptKeys(chained_keys(head[i : i + b] for i in range(0, len(head), b)), len(head))


def block_tokens(settings: Affinity) -> int:
    """Tokens per hashed block in the simulator: ``block_chars / CHARS_PER_TOKEN``, rounded, at least 1."""
    return max(1, round(settings.block_chars / CHARS_PER_TOKEN))


def path_keys(path: Sequence[Segment], settings: Affinity) -> PromptKeys:
    """The keys of a prompt given as its segment path (module docstring, *In the simulator*): one per block of
    :func:`block_tokens` tokens over the first ``max_blocks`` blocks, the last possibly short; ``chars`` in the
    index's units, ``block_chars`` per full block (``block_chars / B`` per token), so the ``min_match`` share
    is the share of hashed tokens matched."""
    b = block_tokens(settings)
    head = min(sum(t for _, t in path), b * settings.max_blocks)
    keys: list[bytes] = []
    segments = iter(path)
    node: object = None  # the key of the segment in hand, which covers tokens [start, stop)
    start = stop = 0
    for end in range(b, head + b, b):
        end = min(end, head)
        while stop < end:
            node, tokens = next(segments)
            start, stop = stop, stop + tokens
        keys.append(repr((node, end - start)).encode())  # segment keys are ints or tuples of ints: repr is exact
    return PromptKeys(keys, round(head * settings.block_chars / b))


def overloaded(load: float, least: float, settings: Affinity) -> bool:
    """Whether a replica at ``load`` (outstanding per unit of capacity) is beyond both thresholds of the least
    loaded one's ``least``: the tier is imbalanced when its most loaded replica is."""
    return load - least > settings.balance_abs and load > settings.balance_rel * least


def first_within_bound(
    order: Sequence[int], outstanding: Sequence[int], weights: Sequence[float], c: float, slack: int
) -> int:
    """The first replica of ``order`` within its bounded load, ``o_r + 1 <= ceil(c (O + 1) w_r / W) + slack``
    (consistent hashing with bounded loads; module docstring, 2 and 4). One always qualifies, as
    ``sum_r ceil(c (O + 1) w_r / W) >= c (O + 1) > O``; the fallback keeps the function total on float edges."""
    cap = c * (sum(outstanding) + 1) / sum(weights)
    for j in order:
        if outstanding[j] + 1 <= math.ceil(cap * weights[j] - 1e-9) + slack:
            return j
    return order[0]


def rendezvous(key: bytes, names: Sequence[str], outstanding: Sequence[int], weights: Sequence[float], c: float) -> int:
    """The position of ``key``'s replica by weighted rendezvous hashing with bounded load (module docstring, 2)."""
    order = sorted(range(len(names)), key=lambda j: _score(key, names[j], weights[j]), reverse=True)
    return first_within_bound(order, outstanding, weights, c, slack=0)


def bounded_pick(depth: Sequence[int], outstanding: Sequence[int], weights: Sequence[float], c: float) -> int:
    """The replica holding the longest match whose load stays within its bound, one request of slack (module
    docstring, 4): replicas in order of match depth, deepest first, ties to the fewest ``(o_r + 1) / w_r``."""
    order = sorted(range(len(depth)), key=lambda j: (-depth[j], (outstanding[j] + 1) / weights[j]))
    return first_within_bound(order, outstanding, weights, c, slack=1)


def _score(key: bytes, name: str, weight: float) -> float:
    """``-w / ln u``, ``u`` in (0, 1) a hash of (key, replica): the largest wins with probability ``w / W``."""
    h = int.from_bytes(hashlib.blake2b(key + name.encode(), digest_size=8).digest(), "little")
    return -weight / math.log((h + 0.5) / _TWO_64)


class AffinityIndex:
    """One tier's approximate radix index of recent prompts and the rule that reads it (module docstring)."""

    __slots__ = ("settings", "entries", "generation")

    def __init__(self, settings: Affinity) -> None:
        self.settings = settings
        #: block key -> [(replica id, its generation when recorded)], most recent last; LRU order of keys
        self.entries: OrderedDict[bytes, list[tuple[str, int]]] = OrderedDict()
        self.generation: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def match(self, keys: Sequence[bytes], names: Sequence[str]) -> list[int]:
        """Per candidate, how many leading keys it holds (the longest matched prefix, in blocks)."""
        where = {name: j for j, name in enumerate(names)}
        depth = [0] * len(names)
        entries, generation = self.entries, self.generation
        for i, key in enumerate(keys):
            entry = entries.get(key)
            if entry is None:
                break
            hit = False
            for name, gen in entry:
                j = where.get(name)
                if j is not None and depth[j] == i and generation.get(name, 0) == gen:
                    depth[j] = i + 1
                    hit = True
            if not hit:
                break
        return depth

    def choose(
        self, keys: PromptKeys, names: Sequence[str], outstanding: Sequence[int], weights: Sequence[float]
    ) -> Route:
        """The rule (module docstring) over the available candidates (at least one): ``names`` (replica ids),
        ``outstanding`` requests and capacity ``weights``, in the same order."""
        s = self.settings
        loads = [o / w for o, w in zip(outstanding, weights, strict=True)]
        if overloaded(max(loads), min(loads), s):
            return Route(None, IMBALANCE, 0)
        if not keys.keys:  # an empty prompt shares nothing
            return Route(None, SHORT_MATCH, 0)
        depth = self.match(keys.keys, names)
        deepest = max(depth)
        if deepest == 0:
            return Route(rendezvous(keys.keys[0], names, outstanding, weights, s.balance_rel), NEW_PREFIX, 0)
        matched = min(deepest * s.block_chars, keys.chars)
        if matched < s.min_match * keys.chars:
            return Route(None, SHORT_MATCH, matched)
        j = bounded_pick(depth, outstanding, weights, s.balance_rel)
        if depth[j] == deepest:
            return Route(j, AFFINITY, matched)
        return Route(j, BOUNDED, min(depth[j] * s.block_chars, keys.chars))

    def record(self, keys: Sequence[bytes], name: str) -> None:
        """``name`` served a prompt with these keys: it becomes their most recent replica, the keys the most
        recently used (deepest first, so parents stay newer than children), and the index is cut to size."""
        tag = (name, self.generation.get(name, 0))
        entries = self.entries
        touch = entries.move_to_end
        for key in reversed(keys):
            entry = entries.get(key)
            if entry is None:
                entries[key] = [tag]
                continue
            if entry[-1] != tag:
                entry[:] = [t for t in entry if t[0] != name][-(PER_KEY - 1) :]
                entry.append(tag)
            touch(key)
        limit = self.settings.index_blocks
        while len(entries) > limit:
            entries.popitem(last=False)

    def forget(self, name: str) -> None:
        """``name`` no longer holds what it served (taken out: failed, marked down, removed): its entries stop
        matching at once (O(1): a new generation) and age out of the index."""
        self.generation[name] = self.generation.get(name, 0) + 1
