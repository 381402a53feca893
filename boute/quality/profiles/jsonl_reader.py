"""The generic ``jsonl`` quality-profile reader, with the LLM judge's record it may carry on every line.

:mod:`boute.quality.profiles` documents the format and registers it in its ``FORMATS`` table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from boute.errors import SpecError
from boute.quality.profiles.cells import jsonl_records, normalise_scores, score_row
from boute.quality.profiles.profile import JudgeRecord, QualityProfile

#: the per-line fields of an LLM judge's record in the ``jsonl`` format (``boute profile quality --cascade-judge``)
JUDGE_FIELDS = ("judge", "judge_scores", "judge_latency_s")


def _judge_numbers(obj: dict, no: int, shown: str, fld: str, keys: list[str], hi: float | None) -> dict[str, float]:
    """``obj[fld]``, an object {model: number in [0, hi]} over some of ``keys`` (``hi`` None: seconds, any
    finite number >= 0); errors name the line and the field."""
    value = obj.get(fld)
    if not isinstance(value, dict) or (fld == "judge_scores" and not value):
        raise SpecError(shown, f"line {no}, field '{fld}'", "missing (expected an object {model: number})")
    out: dict[str, float] = {}
    for m, v in value.items():
        where = f"line {no}, field '{fld}.{m}'"
        if m not in keys:
            raise SpecError(shown, where, f"'{m}' is not one of {', '.join(keys)}")
        number = isinstance(v, int | float) and not isinstance(v, bool) and bool(np.isfinite(v))
        if not (number and 0.0 <= v <= (np.inf if hi is None else hi)):
            want = "seconds >= 0" if hi is None else f"a number in [0, {hi:g}]"
            raise SpecError(shown, where, f"expected {want}, got {v!r}")
        out[m] = float(v)
    return out


class _JudgeLines:
    """Collects the judge fields of a ``jsonl`` profile line by line and checks them: on every line or on
    none, one judge throughout, the same judged models on every line, scores in [0, 1]."""

    def __init__(self, shown: str) -> None:
        self.shown = shown
        self.first = 0  # the first line read, and whether it had judge scores
        self.judged = False
        self.who: dict[str, str] = {}
        self.scores: list[dict[str, float]] = []
        self.latencies: list[float] = []

    def add(self, no: int, obj: dict, models: list[str]) -> None:
        has = any(f in obj for f in JUDGE_FIELDS)
        if not self.first:
            self.first, self.judged = no, has
        if has != self.judged:
            fld = "judge_scores" if not has else next(f for f in JUDGE_FIELDS if f in obj)
            why = f"line {self.first} has judge scores, this line none" if not has else f"line {self.first} has none"
            raise SpecError(self.shown, f"line {no}, field '{fld}'", f"judge scores go on every line or none: {why}")
        if not has:
            return
        who = obj.get("judge")
        if not (isinstance(who, dict) and all(isinstance(who.get(k), str) and who[k] for k in ("name", "model"))):
            raise SpecError(self.shown, f"line {no}, field 'judge'", 'expected {"name": ..., "model": ...}')
        if self.who and who != self.who:
            raise SpecError(
                self.shown, f"line {no}, field 'judge'", f"{who} differs from line {self.first}'s {self.who}"
            )
        self.who = {"name": who["name"], "model": who["model"]}
        scores = _judge_numbers(obj, no, self.shown, "judge_scores", models, 1.0)
        if self.scores and set(scores) != set(self.scores[0]):
            raise SpecError(
                self.shown,
                f"line {no}, field 'judge_scores'",
                f"judges {sorted(scores)}, line {self.first} judges {sorted(self.scores[0])}",
            )
        self.scores.append(scores)
        self.latencies += _judge_numbers(obj, no, self.shown, "judge_latency_s", list(scores), None).values()

    def record(self) -> JudgeRecord | None:
        if not self.judged:
            return None
        judged = list(self.scores[0])
        calls = len(self.latencies)
        return JudgeRecord(
            name=self.who["name"],
            model=self.who["model"],
            scores={m: np.array([row[m] for row in self.scores], dtype=np.float64) for m in judged},
            latency_s=float(np.mean(self.latencies)) if calls else 0.0,
            calls=calls,
        )


def read_jsonl(path: Path, shown: str, scale: tuple[float, float] | None) -> QualityProfile:
    prompts: list[str] = []
    rows: list[list[float]] = []
    resp: list[dict[str, str]] = []
    models: list[str] = []
    judge = _JudgeLines(shown)
    first_line = 0
    for no, obj in jsonl_records(path):
        first_line = first_line or no
        sc = obj.get("scores")
        if not isinstance(sc, dict) or not sc:
            raise SpecError(shown, f"line {no}, field 'scores'", "missing (expected an object {model: score})")
        if not models:
            models = list(sc)
        if set(sc) != set(models):
            missing = sorted(set(models) - set(sc)) or sorted(set(sc) - set(models))
            raise SpecError(shown, f"line {no}, field 'scores'", f"models differ from line {first_line}: {missing}")
        prompt, row = score_row(shown, no, obj.get("prompt"), sc, models, lambda m: f"scores.{m}")
        rows.append(row)
        judge.add(no, obj, models)
        r = obj.get("responses", {})
        if not isinstance(r, dict) or not all(isinstance(v, str) for v in r.values()):
            raise SpecError(shown, f"line {no}, field 'responses'", "expected an object {model: text}")
        resp.append(r)
        prompts.append(prompt)
    if not prompts:
        raise SpecError(shown, None, "no data lines")
    raw = np.array(rows, dtype=np.float64)
    scores, scl = normalise_scores(raw, shown, scale)
    responses = {m: tuple(r.get(m, "") for r in resp) for m in models if all(m in r for r in resp)}
    return QualityProfile(shown, "jsonl", tuple(models), tuple(prompts), scores, scl, responses, judge=judge.record())
