"""What every quality-profile reader shares: JSON lines, CSV rows, the row check, a score cell, the scale.

Kept apart from the per-format readers so each of them checks a query's row (:func:`score_row`), parses a
cell and maps scores to [0, 1] the same way, with errors that name the file, the line and the field.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

import numpy as np

from boute.errors import SpecError

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


class CsvTable:
    """A CSV profile read row by row: its header, then each non-blank row, which must have the header's width.

    ``expected`` says what the header should hold (the error for an empty file names it)."""

    def __init__(self, fh: TextIO, shown: str, expected: str) -> None:
        csv.field_size_limit(1 << 26)
        self.shown = shown
        self._reader = csv.reader(fh)
        header = next(self._reader, None)
        if not header:
            raise SpecError(shown, "line 1", f"empty file: expected {expected}")
        self.header = header
        self.cols = {name: i for i, name in enumerate(header)}

    def rows(self) -> Iterator[tuple[int, list[str]]]:
        """(line number, cells) of each data row; blank rows are skipped, a ragged one names its line."""
        for row in self._reader:
            no = self._reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(self.header):
                raise SpecError(self.shown, f"line {no}", f"{len(row)} columns, header has {len(self.header)}")
            yield no, row


def score_row(
    shown: str,
    no: int,
    prompt: object,
    cells: Mapping[str, object],
    models: Sequence[str],
    field: Callable[[str], str] = str,
) -> tuple[str, list[float]]:
    """The one check of a query's row, in every format that has one: a non-empty prompt, and each model's
    score cell parsed by :func:`parse_score` (``field(model)``: the cell's name in errors). Returns the
    prompt and the raw scores in ``models``' order."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise SpecError(shown, f"line {no}, field 'prompt'", "missing or empty (expected a string)")
    return prompt, [parse_score(cells[m], shown, f"line {no}", field(m)) for m in models]


def parse_score(value: object, file: Path | str, where: str, fld: str) -> float:
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


def normalise_scores(raw: np.ndarray, file: Path | str, scale: tuple[float, float] | None) -> tuple[np.ndarray, tuple]:
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
