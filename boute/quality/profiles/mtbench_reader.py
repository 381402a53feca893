"""The MT-Bench quality-profile reader (``mtbench-jsonl``: FastChat's judgement files).

The questions, answers and multi-turn contexts are not fields of their own: they are extracted from the
judge prompt each line records, so the extraction lives here with the reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from boute.errors import SpecError
from boute.quality.profiles.cells import jsonl_records, normalise_scores, parse_score
from boute.quality.profiles.profile import QualityProfile

_Q_BLOCK = re.compile(r"\[Question\]\n(.*?)\n\n\[The Start of ", re.S)
_ANSWER = re.compile(r"\[The Start of Assistant's Answer\]\n(.*?)\n\[The End of Assistant's Answer\]", re.S)
_CONV = re.compile(r"<\|The Start of Assistant A's Conversation with User\|>(.*?)<\|The End of Assistant A's", re.S)
_USER = re.compile(r"### User:\n(.*?)\n\n### Assistant A:\n(.*?)(?=\n\n### User:|\Z)", re.S)


def mtbench_prompt_response(user_prompt: str, turn: int) -> tuple[str, str] | None:
    """The user's question(s) and the judged answer, extracted from an MT-Bench judge prompt."""
    if turn == 1:
        q, a = _Q_BLOCK.search(user_prompt), _ANSWER.search(user_prompt)
        return (q.group(1).strip(), a.group(1).strip()) if q and a else None
    conv = _CONV.search(user_prompt)
    if not conv:
        return None
    turns = _USER.findall(conv.group(1))
    if len(turns) < turn:
        return None
    return "\n\n".join(u.strip() for u, _ in turns[:turn]), turns[turn - 1][1].strip()


def mtbench_context(user_prompt: str, turn: int) -> str | None:
    """What an engine prefills for that turn: earlier questions *with their answers*, then the question."""
    if turn == 1:
        got = mtbench_prompt_response(user_prompt, 1)
        return got[0] if got else None
    conv = _CONV.search(user_prompt)
    turns = _USER.findall(conv.group(1)) if conv else []
    if len(turns) < turn:
        return None
    return "\n\n".join([*(u.strip() + "\n\n" + a.strip() for u, a in turns[: turn - 1]), turns[turn - 1][0].strip()])


def read_mtbench(path: Path, shown: str, scale: tuple[float, float] | None) -> QualityProfile:
    by_query: dict[tuple[str, int], dict[str, float]] = {}
    text: dict[tuple[str, int], str] = {}
    answers: dict[tuple[str, int], dict[str, str]] = {}
    first_line: dict[tuple[str, int], int] = {}
    context: dict[tuple[str, int], str] = {}
    models: list[str] = []
    for no, obj in jsonl_records(path):
        for fld in ("question_id", "model", "turn", "score"):
            if fld not in obj:
                raise SpecError(shown, f"line {no}, field '{fld}'", "missing")
        model = obj["model"]
        if not isinstance(model, str) or not model:
            raise SpecError(shown, f"line {no}, field 'model'", f"expected a model name, got {model!r}")
        turn = obj["turn"]
        if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
            raise SpecError(shown, f"line {no}, field 'turn'", f"expected a turn number >= 1, got {turn!r}")
        key = (str(obj["question_id"]), turn)
        score = parse_score(obj["score"], shown, f"line {no}", "score")
        if score < 0:  # FastChat writes -1 when the judge's rating could not be parsed
            raise SpecError(shown, f"line {no}, field 'score'", f"no valid judge score ({score:g})")
        slot = by_query.setdefault(key, {})
        if model in slot:
            raise SpecError(
                shown, f"line {no}, field 'model'", f"second judgement of '{model}' for question {key[0]} turn {turn}"
            )
        slot[model] = score
        first_line.setdefault(key, no)
        if model not in models:
            models.append(model)
        up = obj.get("user_prompt")
        if isinstance(up, str):
            got = mtbench_prompt_response(up, turn)
            if got is not None:
                text.setdefault(key, got[0])
                answers.setdefault(key, {})[model] = got[1]
            ctx = mtbench_context(up, turn) if key not in context else None
            if ctx is not None:  # the first judged model's conversation (models answer turn 1 differently)
                context[key] = ctx
    if not by_query:
        raise SpecError(shown, None, "no judgement lines")
    keys = sorted(by_query, key=lambda k: (int(k[0]) if k[0].isdigit() else k[0], k[1]))
    for k in keys:
        missing = [m for m in models if m not in by_query[k]]
        if missing:
            raise SpecError(
                shown, f"line {first_line[k]}", f"question {k[0]} turn {k[1]} has no score for {missing[0]}"
            )
        if k not in text:
            raise SpecError(shown, f"line {first_line[k]}, field 'user_prompt'", "cannot find the user question in it")
    raw = np.array([[by_query[k][m] for m in models] for k in keys], dtype=np.float64)
    scores, scl = normalise_scores(
        raw, shown, scale if scale is not None else ((1.0, 10.0) if raw.min() >= 1 else None)
    )
    responses = {
        m: tuple(answers[k].get(m, "") for k in keys) for m in models if all(m in answers.get(k, {}) for k in keys)
    }
    return QualityProfile(
        source=shown,
        format="mtbench-jsonl",
        models=tuple(models),
        prompts=tuple(text[k] for k in keys),
        scores=scores,
        scale=scl,
        responses=responses,
        query_ids=tuple(f"{q}/{t}" for q, t in keys),
        contexts=tuple(context.get(k, text[k]) for k in keys),
        follows=_follows(keys),
    )


def _follows(keys: list[tuple[str, int]]) -> tuple[int, ...]:
    """Per row, the row of the same question's previous turn (-1 for turn 1, or where that turn is missing)."""
    row = {k: i for i, k in enumerate(keys)}
    return tuple(row.get((q, t - 1), -1) if t > 1 else -1 for q, t in keys)
