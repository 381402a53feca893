"""The CSV quality-profile readers: RouteLLM's (``routellm-csv``) and RouterBench's (``routerbench``).

:mod:`boute.quality.profiles` documents both formats and registers them in its ``FORMATS`` table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from boute.errors import SpecError
from boute.quality.profiles.cells import CsvTable, normalise_scores, parse_score, score_row
from boute.quality.profiles.profile import QualityProfile

#: RouterBench column suffixes: ``<model>|model_response`` and ``<model>|total_cost``
RB_RESPONSE, RB_COST = "|model_response", "|total_cost"
#: RouterBench columns that are neither a prompt nor a model's
_RB_OTHER = ("", "sample_id", "prompt", "eval_name", "oracle_model_to_route_to")


def read_routellm_csv(path: Path, shown: str, scale: tuple[float, float] | None) -> QualityProfile:
    with path.open(encoding="utf-8", newline="") as fh:
        table = CsvTable(fh, shown, "a header with 'prompt' and model columns")
        header, cols = table.header, table.cols
        if "prompt" not in header:
            raise SpecError(shown, "line 1", f"no 'prompt' column (columns: {', '.join(header)})")
        models = [c for c in header if c != "prompt" and not c.endswith("_response") and c]
        if len(models) < 1:
            raise SpecError(shown, "line 1", "no model score columns besides 'prompt'")
        resp_cols = {m: cols[f"{m}_response"] for m in models if f"{m}_response" in cols}
        prompts: list[str] = []
        raw: list[list[float]] = []
        responses: dict[str, list[str]] = {m: [] for m in resp_cols}
        for no, row in table.rows():
            prompt, row_scores = score_row(shown, no, row[cols["prompt"]], {m: row[cols[m]] for m in models}, models)
            prompts.append(prompt)
            raw.append(row_scores)
            for m, ci in resp_cols.items():
                responses[m].append(row[ci])
    if not prompts:
        raise SpecError(shown, None, "no data rows")
    matrix, sc = normalise_scores(np.asarray(raw, dtype=np.float64), shown, scale)
    return QualityProfile(
        source=shown,
        format="routellm-csv",
        models=tuple(models),
        prompts=tuple(prompts),
        scores=matrix,
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


def read_routerbench(path: Path, shown: str, scale: tuple[float, float] | None) -> QualityProfile:
    with path.open(encoding="utf-8", newline="") as fh:
        table = CsvTable(fh, shown, "RouterBench's header (prompt, models, ...)")
        header, cols = table.header, table.cols
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
        for no, row in table.rows():
            qid = row[cols["sample_id"]] if "sample_id" in cols else str(len(ids) + len(dropped))
            if any(not row[cols[m]].strip() for m in models):
                dropped.append(qid)
                continue
            text = _list_text(row[cols["prompt"]], shown, f"line {no}", "prompt")
            prompt, row_scores = score_row(shown, no, text, {m: row[cols[m]] for m in models}, models)
            ids.append(qid)
            prompts.append(prompt)
            raw.append(row_scores)
            for m, ci in resp_cols.items():
                cell = row[ci]
                responses[m].append(_list_text(cell, shown, f"line {no}", m + RB_RESPONSE) if cell.strip() else "")
            for m, ci in cost_cols.items():
                cost = parse_score(row[ci], shown, f"line {no}", m + RB_COST) if row[ci].strip() else float("nan")
                if cost < 0:
                    raise SpecError(shown, f"line {no}, field '{m + RB_COST}'", f"a cost cannot be negative ({cost:g})")
                costs[m].append(cost)
    if not prompts:
        raise SpecError(shown, None, f"no data rows with a score for every model ({len(dropped)} rows have blanks)")
    matrix, sc = normalise_scores(np.asarray(raw, dtype=np.float64), shown, scale)
    return QualityProfile(
        source=shown,
        format="routerbench",
        models=tuple(models),
        prompts=tuple(prompts),
        scores=matrix,
        scale=sc,
        responses={m: tuple(v) for m, v in responses.items() if all(v)},
        query_ids=tuple(ids),
        costs={m: np.asarray(v, dtype=np.float64) for m, v in costs.items()},
        dropped=tuple(dropped),
    )
