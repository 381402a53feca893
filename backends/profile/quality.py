"""Quality profiling: run a dataset through every tier's live endpoint and score each answer.

Output is the ``jsonl`` quality-profile format :func:`boute.quality.profiles.load_profile` reads::

    {"prompt": "...", "scores": {"small": 1.0, "large": 0.0}, "responses": {"small": "...", "large": "..."}}

Scoring: a reference-answer checker where the dataset has references (GSM8K: the final number after
``####``, compared numerically), else an LLM judge at ``--judge URL`` that rates the answer 1-10 (scaled
to [0, 1]). A request that fails scores 0 and is counted, so a flaky tier shows as a worse tier, never as
a silently shorter profile.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boute.errors import BouteError, SpecError
from boute.quality.profile_readers import jsonl_records
from boute.specs.io import write_atomic

__all__ = ["Example", "Tier", "gsm8k_correct", "gsm8k_final_number", "load_dataset", "profile_quality"]

GSM8K_INSTRUCTION = "Solve the problem step by step. End with a line '#### <number>' giving the final answer.\n\n"
JUDGE_PROMPT = (
    "Rate the assistant's answer to the user's question for correctness and helpfulness on a scale of 1 to 10. "
    "Reply with the rating only, as 'Rating: N'.\n\n[Question]\n{prompt}\n\n[Answer]\n{response}"
)

_NUM = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
_MARKED = re.compile(r"####\s*(-?\$?\d[\d,]*(?:\.\d+)?)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*\**\s*(-?\$?\d[\d,]*(?:\.\d+)?)", re.I)
_RATING = re.compile(r"(?:rating\s*:?\s*\[*\s*)?(\d+(?:\.\d+)?)\s*(?:/\s*10)?", re.I)


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


def parse_rating(text: str) -> float:
    """A judge's 'Rating: N' (1-10) -> [0, 1]; unparseable -> 0.0 (treated as a failed answer)."""
    m = _RATING.search(text or "")
    if not m:
        return 0.0
    v = float(m.group(1))
    return min(1.0, max(0.0, (v - 1.0) / 9.0)) if 1.0 <= v <= 10.0 else 0.0


async def _chat(client: Any, url: str, model: str, content: str, max_tokens: int) -> str:
    base = url.rstrip("/").removesuffix("/v1")
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    r = await client.post(f"{base}/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"] or ""


async def _profile(
    examples: Sequence[Example],
    tiers: Sequence[Tier],
    judge: Tier | None,
    max_tokens: int,
    concurrency: int,
    timeout_s: float,
    instruction: str,
    progress: Callable[[str], None] | None,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    failures = {t.name: 0 for t in tiers}

    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:

        async def score(ex: Example, tier: Tier) -> tuple[float, str]:
            async with sem:
                try:
                    text = await _chat(client, tier.url, tier.model or tier.name, instruction + ex.prompt, max_tokens)
                except (httpx.HTTPError, KeyError, ValueError):
                    failures[tier.name] += 1
                    return 0.0, ""
                if ex.reference is not None and judge is None:
                    return gsm8k_correct(text, ex.reference), text
                assert judge is not None
                try:
                    verdict = await _chat(
                        client,
                        judge.url,
                        judge.model or judge.name,
                        JUDGE_PROMPT.format(prompt=ex.prompt, response=text),
                        16,
                    )
                except (httpx.HTTPError, KeyError, ValueError):
                    return 0.0, text
                return parse_rating(verdict), text

        rows = []
        for i, ex in enumerate(examples):
            got = await asyncio.gather(*(score(ex, t) for t in tiers))
            rows.append(
                {
                    "prompt": ex.prompt,
                    "scores": {t.name: s for t, (s, _) in zip(tiers, got, strict=True)},
                    "responses": {t.name: r for t, (_, r) in zip(tiers, got, strict=True)},
                }
            )
            if progress is not None:
                progress(f"{i + 1}/{len(examples)}")
    return rows, failures


def profile_quality(
    examples: Sequence[Example],
    tiers: Sequence[Tier],
    out: str | Path,
    *,
    judge: Tier | None = None,
    max_tokens: int = 512,
    concurrency: int = 4,
    timeout_s: float = 300.0,
    instruction: str = GSM8K_INSTRUCTION,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Score every example on every tier, write the JSONL profile atomically; returns a summary."""
    if not tiers:
        raise BouteError("give at least one --tier NAME=URL")
    if len({t.name for t in tiers}) != len(tiers):
        raise BouteError(f"tier names must be unique, got {[t.name for t in tiers]}")
    if judge is None and any(ex.reference is None for ex in examples):
        raise BouteError("the dataset has examples without a reference answer: give --judge URL")
    rows, failures = asyncio.run(
        _profile(examples, tiers, judge, max_tokens, concurrency, timeout_s, instruction, progress)
    )
    write_atomic(out, "".join(json.dumps(r) + "\n" for r in rows))
    mean = {t.name: sum(r["scores"][t.name] for r in rows) / len(rows) for t in tiers}
    return {"out": str(out), "examples": len(rows), "mean_quality": mean, "failed_requests": failures}
