"""The readers of each quality-profile format (:mod:`boute.quality.profiles` documents the formats).

One function per format, ``(path, shown name, scale) -> QualityProfile``, registered in :data:`READERS` under
the format's name; :func:`boute.quality.profiles.load_profile` picks one. Every validation error names the
file, the line (or column) and the field.
"""

from __future__ import annotations

import ast
import csv
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from boute.errors import SpecError
from boute.quality.profiles import FORMATS, JudgeRecord, QualityProfile

#: RouterBench column suffixes: ``<model>|model_response`` and ``<model>|total_cost``
RB_RESPONSE, RB_COST = "|model_response", "|total_cost"
#: RouterBench columns that are neither a prompt nor a model's
_RB_OTHER = ("", "sample_id", "prompt", "eval_name", "oracle_model_to_route_to")
# Raw scales recognised when the file does not say: booleans / [0,1], 1-10 judge scores, 0-10, percentages.
_KNOWN_SCALES: tuple[tuple[float, float], ...] = ((0.0, 1.0), (1.0, 10.0), (0.0, 10.0), (0.0, 100.0))
_TRUE = {"true", "1", "yes", "correct"}
_FALSE = {"false", "0", "no", "incorrect"}


def jsonl_records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, parsed object) for each non-blank line; malformed JSON names the line."""
    with path.open(encoding="utf-8") as fh:
        for no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecError(path, f"line {no}", f"malformed JSON: {exc.msg}") from None
            if not isinstance(obj, dict):
                raise SpecError(path, f"line {no}", f"expected a JSON object, got {type(obj).__name__}")
            yield no, obj


def _number(value: object, file: Path | str, where: str, fld: str) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and np.isfinite(value):
        return float(value)
    if isinstance(value, str):
        s = value.strip().lower()
        if s in _TRUE:
            return 1.0
        if s in _FALSE:
            return 0.0
        try:
            v = float(s)
        except ValueError:
            v = float("nan")
        if np.isfinite(v):
            return v
    raise SpecError(file, f"{where}, field '{fld}'", f"expected True/False or a number, got {value!r}")


def _normalise(raw: np.ndarray, file: Path | str, scale: tuple[float, float] | None) -> tuple[np.ndarray, tuple]:
    """Map raw scores to [0, 1]; the scale is the given one or the first known scale that contains them."""
    lo_v, hi_v = float(raw.min()), float(raw.max())
    if scale is None:
        for lo, hi in _KNOWN_SCALES:
            if lo <= lo_v and hi_v <= hi:
                scale = (lo, hi)
                break
        else:
            raise SpecError(file, "scores", f"values span [{lo_v:g}, {hi_v:g}]: not a known scale, pass scale=(lo, hi)")
    lo, hi = float(scale[0]), float(scale[1])
    if not hi > lo:
        raise SpecError(file, "scale", f"scale must have hi > lo, got ({lo:g}, {hi:g})")
    if lo_v < lo or hi_v > hi:
        raise SpecError(file, "scores", f"values span [{lo_v:g}, {hi_v:g}], outside the scale ({lo:g}, {hi:g})")
    return (raw - lo) / (hi - lo), (lo, hi)


def _load_csv(path: Path, shown: str, scale: tuple[float, float] | None) -> QualityProfile:
    csv.field_size_limit(1 << 26)
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise SpecError(shown, "line 1", "empty file: expected a header with 'prompt' and model columns")
        if "prompt" not in header:
            raise SpecError(shown, "line 1", f"no 'prompt' column (columns: {', '.join(header)})")
        cols = {name: i for i, name in enumerate(header)}
        models = [c for c in header if c != "prompt" and not c.endswith("_response") and c]
        if len(models) < 1:
            raise SpecError(shown, "line 1", "no model score columns besides 'prompt'")
        resp_cols = {m: cols[f"{m}_response"] for m in models if f"{m}_response" in cols}
        prompts: list[str] = []
        raw: list[list[float]] = []
        responses: dict[str, list[str]] = {m: [] for m in resp_cols}
        for row in reader:
            no = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise SpecError(shown, f"line {no}", f"{len(row)} columns, header has {len(header)}")
            prompt = row[cols["prompt"]]
            if not prompt.strip():
                raise SpecError(shown, f"line {no}, field 'prompt'", "empty prompt")
            prompts.append(prompt)
            raw.append([_number(row[cols[m]], shown, f"line {no}", m) for m in models])
            for m, ci in resp_cols.items():
                responses[m].append(row[ci])
    if not prompts:
        raise SpecError(shown, None, "no data rows")
    scores, sc = _normalise(np.asarray(raw, dtype=np.float64), shown, scale)
    return QualityProfile(
        source=shown,
        format="routellm-csv",
        models=tuple(models),
        prompts=tuple(prompts),
        scores=scores,
        scale=sc,
        responses={m: tuple(v) for m, v in responses.items()},
        query_ids=tuple(str(i) for i in range(len(prompts))),
    )


def _list_text(cell: str, shown: str, where: str, fld: str) -> str:
    """A RouterBench list-literal cell (``['text']``) -> its text; repeated identical elements count once."""
    try:
        value = ast.literal_eval(cell)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise SpecError(
            shown, f"{where}, field '{fld}'", f"expected a Python list literal of strings, got {cell[:40]!r}"
        ) from None
    if isinstance(value, str):
        return value
    if not isinstance(value, list | tuple) or not value or not all(isinstance(v, str) for v in value):
        raise SpecError(shown, f"{where}, field '{fld}'", f"expected a non-empty list of strings, got {cell[:40]!r}")
    parts = [v for i, v in enumerate(value) if i == 0 or v != value[i - 1]]
    return "\n\n".join(parts)


def _load_routerbench(path: Path, shown: str, scale: tuple[float, float] | None) -> QualityProfile:
    csv.field_size_limit(1 << 26)
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise SpecError(shown, "line 1", "empty file: expected RouterBench's header (prompt, models, ...)")
        cols = {name: i for i, name in enumerate(header)}
        if "prompt" not in cols:
            raise SpecError(shown, "line 1", f"no 'prompt' column (columns: {', '.join(header[:8])}, ...)")
        models = [c for c in header if c not in _RB_OTHER and "|" not in c]
        if not models:
            raise SpecError(shown, "line 1", "no model score columns (a column named after each model)")
        for c in header:
            if "|" in c and c.rsplit("|", 1)[0] not in models:
                raise SpecError(
                    shown, f"line 1, column '{c}'", f"names model '{c.rsplit('|', 1)[0]}', which has no score column"
                )
        resp_cols = {m: cols[m + RB_RESPONSE] for m in models if m + RB_RESPONSE in cols}
        cost_cols = {m: cols[m + RB_COST] for m in models if m + RB_COST in cols}
        ids: list[str] = []
        prompts: list[str] = []
        raw: list[list[float]] = []
        responses: dict[str, list[str]] = {m: [] for m in resp_cols}
        costs: dict[str, list[float]] = {m: [] for m in cost_cols}
        dropped: list[str] = []
        for row in reader:
            no = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise SpecError(shown, f"line {no}", f"{len(row)} columns, header has {len(header)}")
            qid = row[cols["sample_id"]] if "sample_id" in cols else str(len(ids) + len(dropped))
            if any(not row[cols[m]].strip() for m in models):
                dropped.append(qid)
                continue
            prompt = _list_text(row[cols["prompt"]], shown, f"line {no}", "prompt")
            if not prompt.strip():
                raise SpecError(shown, f"line {no}, field 'prompt'", "empty prompt")
            ids.append(qid)
            prompts.append(prompt)
            raw.append([_number(row[cols[m]], shown, f"line {no}", m) for m in models])
            for m, ci in resp_cols.items():
                cell = row[ci]
                responses[m].append(_list_text(cell, shown, f"line {no}", m + RB_RESPONSE) if cell.strip() else "")
            for m, ci in cost_cols.items():
                cost = _number(row[ci], shown, f"line {no}", m + RB_COST) if row[ci].strip() else float("nan")
                if cost < 0:
                    raise SpecError(shown, f"line {no}, field '{m + RB_COST}'", f"a cost cannot be negative ({cost:g})")
                costs[m].append(cost)
    if not prompts:
        raise SpecError(shown, None, f"no data rows with a score for every model ({len(dropped)} rows have blanks)")
    scores, sc = _normalise(np.asarray(raw, dtype=np.float64), shown, scale)
    return QualityProfile(
        source=shown,
        format="routerbench",
        models=tuple(models),
        prompts=tuple(prompts),
        scores=scores,
        scale=sc,
        responses={m: tuple(v) for m, v in responses.items() if all(v)},
        query_ids=tuple(ids),
        costs={m: np.asarray(v, dtype=np.float64) for m, v in costs.items()},
        dropped=tuple(dropped),
    )


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


def _load_jsonl(path: Path, shown: str, scale: tuple[float, float] | None) -> QualityProfile:
    prompts: list[str] = []
    rows: list[dict[str, float]] = []
    resp: list[dict[str, str]] = []
    models: list[str] = []
    judge = _JudgeLines(shown)
    first_line = 0
    for no, obj in jsonl_records(path):
        first_line = first_line or no
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecError(shown, f"line {no}, field 'prompt'", "missing or empty (expected a string)")
        sc = obj.get("scores")
        if not isinstance(sc, dict) or not sc:
            raise SpecError(shown, f"line {no}, field 'scores'", "missing (expected an object {model: score})")
        if not models:
            models = list(sc)
        if set(sc) != set(models):
            missing = sorted(set(models) - set(sc)) or sorted(set(sc) - set(models))
            raise SpecError(shown, f"line {no}, field 'scores'", f"models differ from line {first_line}: {missing}")
        rows.append({m: _number(sc[m], shown, f"line {no}", f"scores.{m}") for m in models})
        judge.add(no, obj, models)
        r = obj.get("responses", {})
        if not isinstance(r, dict) or not all(isinstance(v, str) for v in r.values()):
            raise SpecError(shown, f"line {no}, field 'responses'", "expected an object {model: text}")
        resp.append(r)
        prompts.append(prompt)
    if not prompts:
        raise SpecError(shown, None, "no data lines")
    raw = np.array([[r[m] for m in models] for r in rows], dtype=np.float64)
    scores, scl = _normalise(raw, shown, scale)
    responses = {m: tuple(r.get(m, "") for r in resp) for m in models if all(m in r for r in resp)}
    return QualityProfile(shown, "jsonl", tuple(models), tuple(prompts), scores, scl, responses, judge=judge.record())


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


def _load_mtbench(path: Path, shown: str, scale: tuple[float, float] | None) -> QualityProfile:
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
        score = _number(obj["score"], shown, f"line {no}", "score")
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
    scores, scl = _normalise(raw, shown, scale if scale is not None else ((1.0, 10.0) if raw.min() >= 1 else None))
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
    )


#: format name -> reader
READERS: dict[str, Callable[[Path, str, tuple[float, float] | None], QualityProfile]] = {
    "routellm-csv": _load_csv,
    "routerbench": _load_routerbench,
    "mtbench-jsonl": _load_mtbench,
    "jsonl": _load_jsonl,
}
assert set(READERS) == set(FORMATS)
