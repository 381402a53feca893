"""Quality profiles: per-query, per-model quality loaded from the formats users already have.

A profile is a matrix ``scores[query, model]`` normalised to [0, 1] (the raw scale is recorded so numbers
can be shown back in the user's units), the prompt text of every query (the router embeds it) and, where
the file has them, each model's recorded response (the offline verifier learns from those).

Formats:

- ``routellm-csv``: column ``prompt``, one column per model holding True/False or a number, optional
  ``<model>_response`` columns (RouteLLM's ``evals/*.csv``).
- ``mtbench-jsonl``: one GPT-4 judgement per line: ``question_id``, ``model``, ``turn``, ``score`` (1-10),
  ``user_prompt`` (the judge prompt). A query is one ``(question_id, turn)``. Its prompt is the user's
  question(s) extracted from the judge prompt: turn 1 -> the ``[Question]`` block; turn 2 -> both user
  turns of the conversation, joined by a blank line, because the second question only makes sense with
  the first. The response is the assistant's answer to that turn, also taken from the judge prompt.
- ``routerbench``: RouterBench's CSV as it ships (Hu et al. 2024, as split by RouterDC): ``sample_id``,
  ``prompt`` (a Python list literal holding the prompt text; repeated identical elements count once),
  one column per model (1.0 / 0.0; blank where that model has no result), ``<model>|model_response`` (a
  list literal holding the answer) and ``<model>|total_cost`` (USD of that API call), plus bookkeeping
  columns (``eval_name``, ``oracle_model_to_route_to``, an unnamed index) that are ignored. A row with a
  blank score for any model is left out (a profile is a full matrix); ``QualityProfile.dropped`` names
  those rows by ``sample_id`` (ARC-Challenge: 20 of 1,039 train rows, 8 of 445 test rows, mostly rows that
  hold one model's result for a sample another row holds the rest of).
- ``jsonl``: ``{"prompt": ..., "scores": {model: value}, "responses": {model: text}?}`` per line; lines
  written by ``boute profile quality --cascade-judge`` also hold an LLM judge's score of each answer,
  ``"judge_scores": {model: score in [0, 1]}``, the judge that gave them, ``"judge": {"name": ..., "model":
  ...}`` (the same on every line), and the measured seconds of each judge call, ``"judge_latency_s": {model:
  seconds}`` (:class:`JudgeRecord`; what ``quality.judge: llm`` cuts a cascade's thresholds on).

This module (the profile and format detection) with :mod:`boute.quality.profile_readers` (one reader per
format, in its ``READERS`` registry) is the one reader of every format: the quality side (router, verifier, policy quality) and the
workload side (:mod:`boute.workload.profiles`: prompt and answer token lengths) both read profiles here,
so a file that one side accepts the other reads the same way, row for row.

Every validation error names the file, the line (or column) and the field.
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from boute.errors import SpecError

FORMATS = ("routellm-csv", "routerbench", "mtbench-jsonl", "jsonl")


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


def detect_format(path: Path) -> str:
    """The format of a profile file: by suffix, then by the header (CSV) or the first record (JSONL)."""
    from boute.quality.profile_readers import RB_COST, RB_RESPONSE, jsonl_records

    if path.suffix.lower() == ".csv":
        with path.open(encoding="utf-8", newline="") as fh:
            header = next(csv.reader(fh), None) or []
        return "routerbench" if any(c.endswith((RB_RESPONSE, RB_COST)) for c in header) else "routellm-csv"
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        for line in jsonl_records(path):
            obj = line[1]
            return "mtbench-jsonl" if "question_id" in obj else "jsonl"
        raise SpecError(path, None, "file is empty")
    raise SpecError(path, None, f"cannot tell the profile format from suffix '{path.suffix}' (use .csv or .jsonl)")


def load_profile(path: str | Path, format: str = "auto", scale: tuple[float, float] | None = None) -> QualityProfile:
    """Load a quality profile; ``builtin:gsm8k`` and ``builtin:mt-bench`` name the shipped RouteLLM files."""
    from boute.data import data_path

    shown = str(path)
    p = data_path(str(path)) if str(path).startswith("builtin:") else Path(path)
    if not p.is_file():
        raise SpecError(shown, None, "profile file not found")
    fmt = detect_format(p) if format == "auto" else format
    if fmt not in FORMATS:
        raise SpecError(shown, "format", f"unknown profile format '{fmt}' (known: auto, {', '.join(FORMATS)})")
    from boute.quality.profile_readers import READERS

    return READERS[fmt](p, shown, scale)
