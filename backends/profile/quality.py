"""Quality profiling: run a dataset through every tier's live endpoint and score each answer.

Output is the ``jsonl`` quality-profile format :func:`boute.quality.profiles.load_profile` reads::

    {"prompt": "...", "scores": {"small": 1.0, "large": 0.0}, "responses": {"small": "...", "large": "..."}}

Scoring: a reference-answer checker where the dataset has references (GSM8K: the final number after
``####``, compared numerically), else an LLM judge at ``--judge URL`` that rates the answer 1-10 (scaled
to [0, 1]). A request that fails scores 0 and is counted, so a flaky tier shows as a worse tier, never as
a silently shorter profile.

Cascade judge (``--cascade-judge NAME@MODEL=URL``): every answer is also rated by that LLM judge with the
very request the gateway's cascade sends (:class:`boute.quality.judges.LLMJudge`: one template, one rating
parser for both sides), and each line records ``"judge_scores": {tier: score}``, ``"judge": {"name",
"model"}`` and the seconds each call took, ``"judge_latency_s": {tier: s}``. A failed call scores 0.0, as
the gateway scores it (escalate); an answer the tier failed to give is not judged and scores 0.0 (the gateway
returns a failed answer without judging it). The judge sees the profile's prompt, the text the line records,
so the optimiser's thresholds are cut on scores of exactly the (prompt, answer) pairs in the file.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boute.errors import BouteError, SpecError
from boute.quality.judges import LLMJudge
from boute.quality.profiles.cells import jsonl_records
from boute.serving.timeouts import JUDGE_TIMEOUT_S
from boute.specs.io import write_atomic

__all__ = [
    "Example",
    "Tier",
    "gsm8k_correct",
    "gsm8k_final_number",
    "llm_judge",
    "load_dataset",
    "profile_quality",
]

GSM8K_INSTRUCTION = "Solve the problem step by step. End with a line '#### <number>' giving the final answer.\n\n"

_NUM = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
_MARKED = re.compile(r"####\s*(-?\$?\d[\d,]*(?:\.\d+)?)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*\**\s*(-?\$?\d[\d,]*(?:\.\d+)?)", re.I)


@dataclass(frozen=True)
class Example:
    prompt: str
    reference: str | None = None


@dataclass(frozen=True)
class Tier:
    """One tier to profile: its name in the profile, the OpenAI-compatible base URL and served model."""

    name: str
    url: str
    model: str | None = None

    @property
    def base_url(self) -> str:
        """The endpoint's ``/v1`` base, whether ``url`` ends in ``/v1`` or not."""
        return self.url.rstrip("/").removesuffix("/v1") + "/v1"

    @property
    def served(self) -> str:
        """The model name requests carry: the served model, else the tier's name."""
        return self.model or self.name


def llm_judge(judge: Tier, timeout_s: float = JUDGE_TIMEOUT_S) -> LLMJudge:
    """``judge`` as the gateway's LLM judge: same class, so the same request and the same rating parser."""
    return LLMJudge(judge.base_url, judge.served, timeout=timeout_s)


def _clean_number(s: str) -> float | None:
    s = s.replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(s)
    except ValueError:
        return None


def gsm8k_final_number(text: str) -> float | None:
    """The final answer of a GSM8K-style solution: after '####', else 'the answer is N', else the last number."""
    for pattern in (_MARKED, _ANSWER_IS):
        found = pattern.findall(text)
        if found:
            return _clean_number(found[-1])
    nums = _NUM.findall(text)
    return _clean_number(nums[-1]) if nums else None


def gsm8k_correct(response: str, reference: str) -> float:
    """1.0 when the response's final number equals the reference's (to 1e-6), else 0.0."""
    want = gsm8k_final_number(reference)
    got = gsm8k_final_number(response)
    return float(want is not None and got is not None and abs(want - got) <= 1e-6 * max(1.0, abs(want)))


def load_dataset(ref: str, limit: int | None = None) -> list[Example]:
    """``builtin:gsm8k-test`` or a JSONL file with ``question``/``answer`` or ``prompt``/``reference`` fields."""
    from boute.data import data_path

    path = data_path(ref) if ref.startswith("builtin:") else Path(ref)
    if not path.is_file():
        raise SpecError(ref, None, "dataset file not found")
    out: list[Example] = []
    for no, obj in jsonl_records(path):
        prompt = obj.get("question", obj.get("prompt"))
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecError(ref, f"line {no}, field 'question'", "missing or empty (or give 'prompt')")
        reference = obj.get("answer", obj.get("reference"))
        out.append(Example(prompt, str(reference) if reference is not None else None))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise SpecError(ref, None, "no examples")
    return out


async def _chat(client: Any, tier: Tier, content: str, max_tokens: int) -> str:
    body = {
        "model": tier.served,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    r = await client.post(f"{tier.base_url}/chat/completions", json=body)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"] or ""


@dataclass(frozen=True)
class Answer:
    """One tier's answer to one example: its score, its text and, with a cascade judge, that judge's score
    of it and the seconds the call took (None: not judged, the tier gave no answer)."""

    score: float
    text: str
    judge_score: float = 0.0
    judge_s: float | None = None


async def _timed(judge: LLMJudge, prompt: str, text: str, client: Any) -> tuple[float, float]:
    """The judge's score of one answer and the wall seconds the call took (failures included: they cost
    the gateway their time too)."""
    t0 = time.perf_counter()
    score = await judge.ajudge(prompt, text, client)
    return score, time.perf_counter() - t0


def _row(ex: Example, tiers: Sequence[Tier], got: Sequence[Answer], who: dict[str, str] | None) -> dict[str, Any]:
    """One profile line (the ``jsonl`` format of :mod:`boute.quality.profiles`); ``who``: the cascade judge's
    name and model, when there is one."""
    row: dict[str, Any] = {
        "prompt": ex.prompt,
        "scores": {t.name: a.score for t, a in zip(tiers, got, strict=True)},
        "responses": {t.name: a.text for t, a in zip(tiers, got, strict=True)},
    }
    if who is not None:
        row["judge"] = who
        row["judge_scores"] = {t.name: a.judge_score for t, a in zip(tiers, got, strict=True)}
        row["judge_latency_s"] = {t.name: a.judge_s for t, a in zip(tiers, got, strict=True) if a.judge_s is not None}
    return row


async def _profile(
    examples: Sequence[Example],
    tiers: Sequence[Tier],
    judge: LLMJudge | None,
    cascade: LLMJudge | None,
    cascade_name: str,
    max_tokens: int,
    concurrency: int,
    timeout_s: float,
    instruction: str,
    progress: Callable[[str], None] | None,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    failures = {t.name: 0 for t in tiers}
    who = {"name": cascade_name, "model": cascade.model} if cascade is not None else None

    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:

        async def answer(ex: Example, tier: Tier) -> Answer:
            async with sem:
                try:
                    text = await _chat(client, tier, instruction + ex.prompt, max_tokens)
                except (httpx.HTTPError, KeyError, ValueError):
                    failures[tier.name] += 1
                    return Answer(0.0, "")
                if ex.reference is not None and judge is None:
                    score = gsm8k_correct(text, ex.reference)
                else:
                    assert judge is not None
                    score = await judge.ajudge(ex.prompt, text, client)
                if cascade is None:
                    return Answer(score, text)
                rated, took = await _timed(cascade, ex.prompt, text, client)
                return Answer(score, text, rated, took)

        rows = []
        for i, ex in enumerate(examples):
            got = await asyncio.gather(*(answer(ex, t) for t in tiers))
            rows.append(_row(ex, tiers, got, who))
            if progress is not None:
                progress(f"{i + 1}/{len(examples)}")
    return rows, failures


def profile_quality(
    examples: Sequence[Example],
    tiers: Sequence[Tier],
    out: str | Path,
    *,
    judge: Tier | None = None,
    cascade_judge: Tier | None = None,
    judge_timeout_s: float = JUDGE_TIMEOUT_S,
    max_tokens: int = 512,
    concurrency: int = 4,
    timeout_s: float = 300.0,
    instruction: str = GSM8K_INSTRUCTION,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Score every example on every tier, write the JSONL profile atomically; returns a summary.

    ``judge`` scores answers where the dataset has no reference; ``cascade_judge`` rates every answer as the
    gateway's cascade judge would (module doc), each call given ``judge_timeout_s`` as the gateway gives it.
    """
    if not tiers:
        raise BouteError("give at least one --tier NAME=URL")
    if len({t.name for t in tiers}) != len(tiers):
        raise BouteError(f"tier names must be unique, got {[t.name for t in tiers]}")
    if judge is None and any(ex.reference is None for ex in examples):
        raise BouteError("the dataset has examples without a reference answer: give --judge URL")
    scorer = llm_judge(judge, timeout_s) if judge is not None else None  # scoring waits as long as a tier
    cascade = llm_judge(cascade_judge, judge_timeout_s) if cascade_judge is not None else None
    name = cascade_judge.name if cascade_judge is not None else ""
    rows, failures = asyncio.run(
        _profile(examples, tiers, scorer, cascade, name, max_tokens, concurrency, timeout_s, instruction, progress)
    )
    write_atomic(out, "".join(json.dumps(r) + "\n" for r in rows))
    mean = {t.name: sum(r["scores"][t.name] for r in rows) / len(rows) for t in tiers}
    summary: dict[str, Any] = {
        "out": str(out),
        "examples": len(rows),
        "mean_quality": mean,
        "failed_requests": failures,
    }
    if cascade is not None:
        took = [s for r in rows for s in r["judge_latency_s"].values()]
        summary["cascade_judge"] = {
            "name": name,
            "model": cascade.model,
            "calls": len(took),
            "failed": cascade.failures,
            "mean_latency_s": sum(took) / len(took) if took else None,
        }
    return summary
