"""A quality profile: per-query, per-model quality in [0, 1], with the prompts and, where recorded, answers.

What every reader of :mod:`boute.quality.profiles` returns (the package documents the formats).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from boute.errors import SpecError


@dataclass(frozen=True)
class JudgeRecord:
    """An LLM judge's recorded score of every profile answer (``boute profile quality --cascade-judge``).

    ``scores[model]`` is the judge's score of that model's answer to each query, in [0, 1] as
    :meth:`boute.quality.judges.LLMJudge.ajudge` returns it (0.0 where the call failed: the gateway escalates
    then too). ``latency_s`` is the mean wall time of one judge call as measured while profiling (over
    ``calls`` calls): what the simulator charges a judged cascade hop. A mean is enough there because the
    simulator charges every hop one fixed delay; the spread of the judge's latency is not modelled.
    """

    name: str
    model: str  # the model name the judge endpoint served (what a plan names, and the gateway must send)
    scores: dict[str, np.ndarray]
    latency_s: float
    calls: int


@dataclass(frozen=True)
class QualityProfile:
    """Per-query quality of several models; ``scores`` is (n_queries, n_models) in [0, 1]."""

    source: str
    format: str
    models: tuple[str, ...]
    prompts: tuple[str, ...]
    scores: np.ndarray
    scale: tuple[float, float]
    responses: dict[str, tuple[str, ...]] = field(default_factory=dict)
    query_ids: tuple[str, ...] = ()
    #: what a serving engine prefills for each query, where it is more than the prompt (MT-Bench turn 2:
    #: the first question, its answer and the second question); empty: the prompts themselves
    contexts: tuple[str, ...] = ()
    #: recorded per-query price of each model's answer (RouterBench's ``total_cost``, USD), where the file has it
    costs: dict[str, np.ndarray] = field(default_factory=dict)
    #: rows of the file left out (RouterBench: a blank score), by their id in the file
    dropped: tuple[str, ...] = ()
    #: an LLM judge's recorded scores of the answers (``jsonl`` written with ``--cascade-judge``), or None
    judge: JudgeRecord | None = None
    #: per query, the row of the turn it follows in the same recorded conversation (MT-Bench turn 2: its
    #: question's turn 1), -1 for a conversation's first turn; empty: every query stands alone
    follows: tuple[int, ...] = ()

    @property
    def records_conversations(self) -> bool:
        """Whether some query is the recorded next turn of another (MT-Bench's turn 2)."""
        return any(f >= 0 for f in self.follows)

    def continues(self, row: int, previous: int) -> bool:
        """Whether query ``row`` is the recorded next turn of query ``previous`` (a conversation's turn 2 asked
        after its own turn 1, as the profile's judges scored it)."""
        return bool(self.follows) and previous >= 0 and self.follows[row] == previous

    def next_turns(self) -> np.ndarray:
        """int64 per query: the row of the recorded turn that follows it, -1 none (the inverse of ``follows``)."""
        out = np.full(len(self.prompts), -1, dtype=np.int64)
        for row, prev in enumerate(self.follows):
            if prev >= 0:
                out[prev] = row
        return out

    def conversation_groups(self) -> np.ndarray | None:
        """int64 per query: the row that opens its recorded conversation (its own row for a query standing
        alone); None where no query follows another. Why: a train/test split must keep a conversation's turns
        together, since a later turn's prompt holds the earlier turns' text (MT-Bench's turn 2 repeats its
        turn-1 question), so a split by query would train on text it then tests on."""
        if not self.records_conversations:
            return None
        groups = np.empty(len(self.prompts), dtype=np.int64)
        for row in range(len(self.prompts)):
            first = row
            while self.follows[first] >= 0:  # a turn follows one of a lower turn number: no cycle
                first = self.follows[first]
            groups[row] = first
        return groups

    @property
    def served_prompts(self) -> tuple[str, ...]:
        """The text an engine prefills per query: the workload's input lengths are counted on it."""
        return self.contexts or self.prompts

    def __len__(self) -> int:
        return len(self.prompts)

    def column(self, model: str) -> np.ndarray:
        """Scores of one model (a view, [0, 1])."""
        if model not in self.models:
            raise SpecError(self.source, "models", f"model '{model}' not in profile (has: {', '.join(self.models)})")
        return self.scores[:, self.models.index(model)]

    def mean_quality(self) -> dict[str, float]:
        return {m: float(self.scores[:, i].mean()) for i, m in enumerate(self.models)}

    def to_raw(self, value: float | np.ndarray) -> float | np.ndarray:
        """Back to the file's own units (e.g. an MT-Bench score 1-10)."""
        lo, hi = self.scale
        return lo + value * (hi - lo)

    @property
    def content_hash(self) -> str:
        """Identifies the data (prompts, models, scores): a router trained on it records this."""
        h = hashlib.sha256()
        for p in self.prompts:
            h.update(p.encode())
            h.update(b"\0")
        h.update("\0".join(self.models).encode())
        h.update(np.ascontiguousarray(self.scores, dtype=np.float64).tobytes())
        return h.hexdigest()[:16]
