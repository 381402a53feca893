"""What requests' prompts share: shared system prompts and multi-turn conversations, as a tree of segments.

Why a tree: a prompt that repeats another's beginning can be served from a replica's prefix cache
(:mod:`boute.perf.prefix_cache`), and what it repeats is always a chain of earlier segments: a system
prompt, then a conversation's turn-1 question, its answer, the turn-2 question, and so on. Each segment is a
*node* (its parent and the tokens it adds); a request's prompt is the path from a root to its
``prompt_node``, and the answer a later turn repeats is its ``answer_node`` (a child of the prompt node).
Node ids are the cache keys: equal ids are equal content, so a path is a valid prefix-cache path as is.

The drawing rules (``workload.prefixes`` of a scenario, :class:`boute.specs.scenario.Prefixes`):

- **conversations**: requests are taken in arrival order; a request becomes the next turn of the oldest
  conversation whose next turn is due (due at the previous turn's arrival + an exponential think time of
  mean ``think_s``), else it opens a new conversation. Turn k + 1's prompt is turn k's prompt, turn k's
  answer (its recorded length, ``output_tokens``) and a new question of the request's own drawn length.
  A conversation whose next prompt would pass ``lengths.max_input`` ends there; that request opens a new one.
  Where the quality profile records conversations (MT-Bench: each question's turn 1 and turn 2), conversations
  open on first turns and the next turn asks the recorded next question (:class:`RecordedTurns`): its own
  prompt's tokens after the history, its own recorded answer; a turn with nothing recorded after it (a third
  turn of MT-Bench) asks the question its request drew.
- **system prompts**: a conversation opens with system prompt k (of ``count``, lengths uniform in
  ``[min_tokens, max_tokens]``) with probability proportional to ``k ** -zipf``.

Equal texts are one node: a profile prompt that recurs after the same segments (drawn again, as prompts
are drawn with replacement), and the answer to one prompt node, so a recurring prompt hits a cache that
holds it, as on real engines (MT-Bench's 48 held-out prompts recur dozens of times a minute).

Prompt lengths grow accordingly: ``input_tokens`` becomes the whole path's tokens, so the simulator and the
fast path charge a cache miss its full prefill.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from boute.specs.scenario import Prefixes as PrefixSpec

Segment = tuple[Hashable, int]


@dataclass(frozen=True)
class Prefixes:
    """The segment tree of a workload and each request's place in it (module docstring)."""

    parent: np.ndarray  # int64 per node: its parent node, -1 for a root
    tokens: np.ndarray  # int64 per node: tokens it adds to its parent's
    prompt_node: np.ndarray  # int64 per request: its prompt is the path from a root to this node
    answer_node: np.ndarray  # int64 per request: the node of its answer a later turn repeats, -1 none
    conversation: np.ndarray  # int64 per request: its conversation id
    turn: np.ndarray  # int64 per request: 1 for a conversation's first request
    answer_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per node: whose answer, -1

    def paths(self, final_tier: np.ndarray | None = None) -> Paths:
        """The cache paths of the prompts once ``final_tier[i]``, the tier whose answer request i's client gets,
        is known (None: one tier answers everything)."""
        return Paths(self, final_tier)

    def previous(self, request: int) -> int:
        """A request whose prompt and answer this one's prompt repeats: the conversation's previous turn, or the
        first request with the same text (equal texts are one node); -1 for a conversation's first turn."""
        parent = int(self.parent[int(self.prompt_node[request])])
        return int(self.answer_of[parent]) if parent >= 0 else -1

    def least_prefill(self) -> float:
        """The fewest prompt tokens per request any placement could prefill: every segment a prompt holds (not an
        answer, which decoding put in the cache) must be prefilled once somewhere, and every request prefills
        at least its last token, so the requests' total is at least ``max(n, sum of those segments)``. What
        the capacity screen charges, so its bound holds however well the caches do."""
        n = len(self.prompt_node)
        if n == 0:
            return 1.0
        on_paths = np.zeros(len(self.parent), dtype=bool)
        for node in np.unique(self.prompt_node):
            node = int(node)
            while node >= 0 and not on_paths[node]:
                on_paths[node] = True
                node = int(self.parent[node])
        prompted = float(self.tokens[on_paths & (self.answer_of < 0)].sum())
        return max(float(n), prompted) / n


class Paths:
    """Prefix-cache paths of a workload's prompts, with each earlier answer named by the tier that gave it.

    Why the tier: turn k + 1 repeats the answer its client got, which is the answer of the tier that served
    turn k last, and each tier's model answers differently. So an answer segment's key is ``(node, tier)``:
    turn k + 1 can hit it only on a replica of that tier that served turn k (or a later turn of the same
    conversation), as on real engines. Other segments are keyed by their node id. Answer segments keep the
    tree's token count in prompts (the length the workload drew); :meth:`full` caches the answer as generated.
    """

    def __init__(self, prefixes: Prefixes, final_tier: np.ndarray | None) -> None:
        self.prefixes = prefixes
        self.final_tier = final_tier
        self._memo: dict[int, tuple[Segment, ...]] = {}

    def _key(self, node: int) -> Hashable:
        owner = int(self.prefixes.answer_of[node])
        if owner < 0:
            return node
        return (node, 0 if self.final_tier is None else int(self.final_tier[owner]))

    def path(self, node: int) -> tuple[Segment, ...]:
        """The segments ``(key, tokens)`` from a root to ``node``, root first (memoised)."""
        got = self._memo.get(node)
        if got is None:
            parent = int(self.prefixes.parent[node])
            own = ((self._key(node), int(self.prefixes.tokens[node])),)
            got = own if parent < 0 else self.path(parent) + own
            self._memo[node] = got
        return got

    def prompt(self, request: int) -> tuple[Segment, ...]:
        return self.path(int(self.prefixes.prompt_node[request]))

    def full(self, request: int, tier: int, answer_tokens: int) -> tuple[Segment, ...]:
        """The prompt and the answer tier ``tier`` generated (what its replica caches when the request ends)."""
        node = int(self.prefixes.answer_node[request])
        key: Hashable = (node, tier) if node >= 0 else ("answer", request, tier)
        return self.prompt(request) + ((key, int(answer_tokens)),)


class _Tree:
    def __init__(self) -> None:
        self.parent: list[int] = []
        self.tokens: list[int] = []
        self.total: list[int] = []  # tokens from the root through the node
        self.answer_of: list[int] = []
        self.named: dict[tuple[int, Hashable], int] = {}  # (parent, content) -> node: equal text, one node

    def add(self, parent: int, tokens: int, answer_of: int = -1) -> int:
        self.parent.append(parent)
        self.tokens.append(tokens)
        self.answer_of.append(answer_of)
        self.total.append(tokens + (self.total[parent] if parent >= 0 else 0))
        return len(self.parent) - 1

    def child(self, parent: int, content: Hashable | None, tokens: int, answer_of: int = -1) -> int:
        """The node of ``content`` after ``parent``: the one already there, or a new one (``content`` None: a
        text no other request has)."""
        if content is None:
            return self.add(parent, tokens, answer_of)
        node = self.named.get((parent, content))
        if node is None:
            node = self.named[(parent, content)] = self.add(parent, tokens, answer_of)
        return node


@dataclass(frozen=True)
class RecordedTurns:
    """A quality profile's recorded conversations, per profile row: the row of the turn that follows it (-1
    none) and the tokens of its own prompt (a later turn's, without the earlier turns the row's full context
    holds). With them a conversation's next turn asks its recorded next question, not a fresh draw."""

    next_row: np.ndarray  # int64 per profile row
    own_tokens: np.ndarray  # int64 per profile row
    answer_tokens: np.ndarray  # int64 per profile row: its recorded answer's length (the next turn repeats it)


def draw_prefixes(
    spec: PrefixSpec,
    arrival_s: np.ndarray,
    question_tokens: np.ndarray,
    answer_tokens: np.ndarray,
    max_input: int,
    rng: np.random.Generator,
    rows: np.ndarray | None = None,
    recorded: RecordedTurns | None = None,
) -> tuple[Prefixes, np.ndarray, np.ndarray]:
    """The segment tree for requests arriving at ``arrival_s`` whose own new text is ``question_tokens`` long,
    each request's whole prompt length, and the profile row each request asks (module docstring for the
    rules). ``rows[i]``: the profile row whose prompt request i asks (-1 or None: a text of its own); equal
    rows after equal segments are one node, as their texts are one text (what a replica's cache hits when a
    prompt recurs), and so is the answer to one node (each tier answers a prompt with one recorded text;
    :class:`Paths` names the tier). With ``recorded``, a request that continues a conversation whose last turn
    asked a row with a recorded next turn asks that row instead (its own prompt's tokens after the history):
    MT-Bench's turn 2 after its own turn 1; where none is recorded it asks its drawn row, as without."""
    n = len(arrival_s)
    asked = np.full(n, -1, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64).copy()
    answers = np.asarray(answer_tokens, dtype=np.int64).copy()  # a recorded turn's own, once it is asked
    tree = _Tree()
    roots = _system_prompts(spec, tree, rng)
    popularity = None if not roots else np.arange(1, len(roots) + 1, dtype=float) ** -spec.system_prompts.zipf  # type: ignore[union-attr]
    opener = (
        rng.choice(len(roots), size=n, p=popularity / popularity.sum()) if popularity is not None else np.zeros(n, int)
    )
    conv = spec.conversations
    think = rng.exponential(conv.think_s, size=n) if conv is not None and conv.think_s > 0 else np.zeros(n)
    prompt_node = np.empty(n, dtype=np.int64)
    answer_node = np.full(n, -1, dtype=np.int64)
    conversation = np.empty(n, dtype=np.int64)
    turn = np.ones(n, dtype=np.int64)
    due: list[tuple[float, int, int]] = []  # (due time, conversation, its last request)
    conversations = 0
    for i in range(n):
        drawn = (int(asked[i]), int(question_tokens[i]))
        row, q = drawn
        prev = -1
        if due and due[0][0] <= arrival_s[i]:
            _, c, prev = heapq.heappop(due)
            nxt = int(recorded.next_row[asked[prev]]) if recorded is not None and asked[prev] >= 0 else -1
            if nxt >= 0:  # the conversation's recorded next question (its own prompt after the history)
                row, q = nxt, int(recorded.own_tokens[nxt])  # type: ignore[union-attr]
            answer = answer_node[prev] = tree.child(int(prompt_node[prev]), "answer", int(answers[prev]), prev)
            if tree.total[answer] + q > max_input:  # the context is full: this request opens a new conversation
                answer_node[prev], prev = -1, -1
                row, q = drawn
        if prev >= 0:
            conversation[i], turn[i] = c, turn[prev] + 1
            parent = int(answer_node[prev])
        else:
            conversation[i], conversations = conversations, conversations + 1
            parent = roots[int(opener[i])] if roots else -1
        if row != asked[i]:
            asked[i], answers[i] = row, recorded.answer_tokens[row]  # type: ignore[union-attr]
        room = max_input - (tree.total[parent] if parent >= 0 else 0)
        prompt_node[i] = tree.child(parent, ("prompt", row) if row >= 0 else None, max(1, min(q, room)))
        if conv is not None and turn[i] < conv.turns:
            heapq.heappush(due, (float(arrival_s[i] + think[i]), int(conversation[i]), i))
    total = np.asarray(tree.total, dtype=np.int64)
    prefixes = Prefixes(
        np.asarray(tree.parent, dtype=np.int64),
        np.asarray(tree.tokens, dtype=np.int64),
        prompt_node,
        answer_node,
        conversation,
        turn,
        np.asarray(tree.answer_of, dtype=np.int64),
    )
    return prefixes, total[prompt_node], asked


def _system_prompts(spec: PrefixSpec, tree: _Tree, rng: np.random.Generator) -> list[int]:
    sp = spec.system_prompts
    if sp is None:
        return []
    lengths = rng.integers(sp.min_tokens, sp.max_tokens + 1, size=sp.count)
    return [tree.add(-1, int(t)) for t in lengths]
