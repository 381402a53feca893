"""Prompt and response lengths of a quality profile (the paper's workload: GSM8K prompts + recorded responses).

Row ``i`` of the returned arrays is row ``i`` of the profile, so a request's ``prompt_index`` lets the
quality model look up that very prompt. Row order:

- RouteLLM CSV (``builtin:gsm8k``): the CSV's rows.
- MT-Bench judgements JSONL (``builtin:mt-bench``): one row per (question_id, turn), sorted. Turn 1's
  prompt is the first user message; turn 2's is the whole conversation so far (Q1, A1, Q2), because a
  serving engine prefills all of it.
- generic JSONL: one row per line with a ``prompt`` field and optional ``response`` / ``<model>_response``.

Output length of a prompt = the mean token count of the responses recorded for the scenario's tier
models (``Tier.quality_model``, else the tier name); if none of them has a recorded response, the mean over
all recorded responses. A single length per prompt keeps cascades simple (every hop generates about as
much as the final answer); the large and small models' GSM8K responses differ by ~10% on average.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from boute.data import data_path
from boute.errors import SpecError
from boute.workload.tokens import cached_counts


@dataclass(frozen=True)
class ProfileLengths:
    input_tokens: np.ndarray  # int64 per profile row
    output_tokens: np.ndarray  # int64 per profile row (mean over the chosen models' responses)
    models: tuple[str, ...]  # whose responses were averaged


def _detect(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    if path.suffix == ".csv":
        return "routellm-csv"
    with open(path, encoding="utf-8") as fh:
        first = fh.readline()
    try:
        rec = json.loads(first)
    except json.JSONDecodeError:
        raise SpecError(path, "line 1", "cannot detect profile format (expected CSV or JSONL)") from None
    return "mtbench-jsonl" if isinstance(rec, dict) and "user_prompt" in rec and "turn" in rec else "jsonl"


def _routellm_csv(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None or "prompt" not in reader.fieldnames:
            raise SpecError(path, "header", "a RouteLLM CSV needs a 'prompt' column")
        rows = list(reader)
    models = [c.removesuffix("_response") for c in reader.fieldnames if c.endswith("_response")]
    return [r["prompt"] for r in rows], {m: [r[f"{m}_response"] or "" for r in rows] for m in models}


def _between(text: str, start: str, end: str) -> str:
    head, sep, tail = text.partition(start)
    if not sep:
        raise ValueError(f"missing {start!r}")
    return tail.partition(end)[0].strip()


def _split_conversation(text: str) -> list[tuple[str, str]]:
    """An MT-Bench judge prompt -> [(user message, assistant answer), ...] in turn order.

    Single-turn judge templates hold ``[Question]`` and ``[The Start of Assistant's Answer]``; multi-turn
    ones hold the assistant's whole conversation as ``### User:`` / ``### Assistant A:`` blocks.
    """
    if "<|The Start of Assistant A's Conversation with User|>" in text:
        body = _between(text, "<|The Start of Assistant A's Conversation with User|>", "<|The End of Assistant A's")
        turns = []
        for chunk in body.split("### User:")[1:]:
            user, _, answer = chunk.partition("### Assistant A:")
            turns.append((user.strip(), answer.strip()))
        return turns
    question = _between(text, "[Question]", "[The Start of")
    return [(question, _between(text, "[The Start of Assistant's Answer]", "[The End of Assistant's Answer]"))]


def _mtbench_jsonl(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    prompts: dict[tuple[int, int], str] = {}
    answers: dict[str, dict[tuple[int, int], str]] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                qid, turn, model = int(rec["question_id"]), int(rec["turn"]), str(rec["model"])
                conv = _split_conversation(rec["user_prompt"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise SpecError(path, f"line {lineno}", f"bad MT-Bench record ({exc})") from None
            if turn < 1 or len(conv) < turn:
                raise SpecError(path, f"line {lineno}", f"conversation has fewer than {turn} turns")
            context = conv[: turn - 1]
            prompts[(qid, turn)] = "\n\n".join([*(u + "\n\n" + a for u, a in context), conv[turn - 1][0]])
            answers.setdefault(model, {})[(qid, turn)] = conv[turn - 1][1]
    keys = sorted(prompts)
    return [prompts[k] for k in keys], {m: [a.get(k, "") for k in keys] for m, a in answers.items()}


def _generic_jsonl(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    prompts: list[str] = []
    responses: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                prompts.append(str(rec["prompt"]))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise SpecError(path, f"line {lineno}", f"bad profile record ({exc})") from None
            for key, val in rec.items():
                if key == "response" or key.endswith("_response"):
                    name = key.removesuffix("_response") if key != "response" else "response"
                    responses.setdefault(name, [""] * (len(prompts) - 1)).append(str(val))
            for col in responses.values():
                col.extend([""] * (len(prompts) - len(col)))
    return prompts, responses


_READERS = {"routellm-csv": _routellm_csv, "mtbench-jsonl": _mtbench_jsonl, "jsonl": _generic_jsonl}


@lru_cache(maxsize=8)
def _profile_counts(path: Path, fmt: str, mtime_ns: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    prompts, responses = _READERS[fmt](path)
    if not prompts:
        raise SpecError(path, None, "the profile has no prompts")
    cols = {"__prompt__": prompts, **{f"r:{m}": texts for m, texts in responses.items()}}
    counts = cached_counts([fmt, path.read_bytes()], cols)
    return counts["__prompt__"], {m: counts[f"r:{m}"] for m in responses}


def profile_lengths(
    profile: str, fmt: str = "auto", models: tuple[str, ...] = (), base: Path | None = None
) -> ProfileLengths:
    """Token lengths of a profile's prompts and of the responses of ``models`` (see module doc)."""
    path = data_path(profile, base)
    if not path.is_file():
        raise SpecError(path, None, "quality profile not found")
    kind = _detect(path, fmt)
    prompt_counts, response_counts = _profile_counts(path.resolve(), kind, path.stat().st_mtime_ns)
    chosen = tuple(m for m in models if m in response_counts) or tuple(sorted(response_counts))
    if not chosen:
        raise SpecError(path, None, "the profile records no responses, so output lengths are unknown")
    out = np.rint(np.mean([response_counts[m] for m in chosen], axis=0)).astype(np.int64)
    return ProfileLengths(prompt_counts.copy(), np.maximum(out, 1), chosen)
