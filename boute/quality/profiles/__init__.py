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

This package is the one reader of every format: :data:`FORMATS` is its one table (format name -> reader,
one module per reader), each reader checks a query's row with :func:`~boute.quality.profiles.cells.score_row`
and its cells with the same parser and scale, and :func:`load_profile` picks the reader. The quality side
(router, verifier, policy quality) and the workload side (:mod:`boute.workload.profiles`: prompt and answer
token lengths) both read profiles here, so a file that one side accepts the other reads the same way, row
for row.

Every validation error names the file, the line (or column) and the field.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

from boute.errors import SpecError
from boute.quality.profiles.cells import jsonl_records
from boute.quality.profiles.csv_readers import RB_COST, RB_RESPONSE, read_routellm_csv, read_routerbench
from boute.quality.profiles.jsonl_reader import read_jsonl
from boute.quality.profiles.mtbench_reader import read_mtbench
from boute.quality.profiles.profile import JudgeRecord, QualityProfile

__all__ = ["FORMATS", "JudgeRecord", "QualityProfile", "detect_format", "load_profile"]

#: a format's reader: ``(path, name shown in errors, scale or None) -> QualityProfile``
Reader = Callable[[Path, str, tuple[float, float] | None], QualityProfile]

#: the formats, by name: the one table (``load_profile(format=...)`` takes a key, errors list them in order)
FORMATS: dict[str, Reader] = {
    "routellm-csv": read_routellm_csv,
    "routerbench": read_routerbench,
    "mtbench-jsonl": read_mtbench,
    "jsonl": read_jsonl,
}


def detect_format(path: Path) -> str:
    """The format of a profile file: by suffix, then by the header (CSV) or the first record (JSONL)."""
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
    return FORMATS[fmt](p, shown, scale)
