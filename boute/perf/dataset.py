"""The published serving measurements shipped in ``boute/perf/data/published.csv`` (see its README).

One row is one published figure: engine, model, dtypes, GPU, TP/PP, how the benchmark drove the engine
(``mode``), the lengths, the metric and its value, with the source address. ``in_scope`` is False for
rows the model does not claim to predict (their ``note`` says why); they stay in the file so the data
remain complete.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Literal, TypeGuard, get_args

Mode = Literal["static", "max_throughput", "online_rate", "concurrency"]
MODES: tuple[str, ...] = get_args(Mode)
#: what a published row or a measured point (:class:`boute.perf.calibration.MeasuredPoint`) can hold
Metric = Literal["ttft_ms", "tpot_ms", "output_tokens_per_s"]
METRICS: tuple[str, ...] = get_args(Metric)


#: the last row of dataset version 1 (9 sources); later rows came with the v0.10-v0.14 tables. Reports keep
#: the version-1 rows' held-out error apart, to compare with the figures published before the data grew
VERSION_1_LAST_ID = 958


def is_metric(name: str) -> TypeGuard[Metric]:
    """Whether ``name`` is one of :data:`METRICS` (and, for the type checker, a :data:`Metric`)."""
    return name in METRICS


@dataclass(frozen=True)
class PublishedRow:
    """One published figure (units: ms for latencies, output tokens/s for throughput)."""

    id: int
    source_id: str
    engine: str
    engine_version: str
    model: str
    model_as_published: str
    dtype: str
    kv_dtype: str
    gpu: str
    tp: int
    pp: int
    mode: str
    batch: int | None
    concurrency: int | None
    rate_rps: float | None
    input_len: int
    output_len: int
    metric: str
    value: float
    per_gpu: bool
    in_scope: bool
    note: str
    source_url: str
    date: str

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"row {self.id}: mode must be one of {MODES}, got '{self.mode}'")
        if self.metric not in METRICS:
            raise ValueError(f"row {self.id}: metric must be one of {METRICS}, got '{self.metric}'")
        if not self.value > 0:
            raise ValueError(f"row {self.id}: value must be > 0")
        if not self.source_url.startswith("https://"):
            raise ValueError(f"row {self.id}: every row needs its source address")

    @property
    def label(self) -> str:
        """Short human description: what was measured, where."""
        if self.mode == "static":
            load = f"batch {self.batch}"
        elif self.mode == "online_rate":
            load = f"{self.rate_rps:g} req/s"
        elif self.mode == "concurrency":
            load = f"{self.concurrency} users"
        else:
            load = "max throughput"
        par = f"tp{self.tp}" + (f"pp{self.pp}" if self.pp > 1 else "")
        return (
            f"{self.model} {self.dtype} {self.gpu} {par} {self.engine} {load} "
            f"{self.input_len}/{self.output_len} {self.metric}"
        )


def _opt_int(s: str) -> int | None:
    return int(s) if s.strip() else None


def _opt_float(s: str) -> float | None:
    return float(s) if s.strip() else None


def parse_rows(text: str) -> tuple[PublishedRow, ...]:
    """Rows of a published.csv text (raises ValueError naming the row on a bad value)."""
    out = []
    for r in csv.DictReader(text.splitlines()):
        out.append(
            PublishedRow(
                id=int(r["id"]),
                source_id=r["source_id"],
                engine=r["engine"],
                engine_version=r["engine_version"],
                model=r["model"],
                model_as_published=r["model_as_published"],
                dtype=r["dtype"],
                kv_dtype=r["kv_dtype"],
                gpu=r["gpu"],
                tp=int(r["tp"]),
                pp=int(r["pp"]),
                mode=r["mode"],
                batch=_opt_int(r["batch"]),
                concurrency=_opt_int(r["concurrency"]),
                rate_rps=_opt_float(r["rate_rps"]),
                input_len=int(r["input_len"]),
                output_len=int(r["output_len"]),
                metric=r["metric"],
                value=float(r["value"]),
                per_gpu=r["per_gpu"] == "1",
                in_scope=r["in_scope"] == "1",
                note=r["note"],
                source_url=r["source_url"],
                date=r["date"],
            )
        )
    return tuple(out)


@lru_cache(maxsize=1)
def published_rows() -> tuple[PublishedRow, ...]:
    """Every row of the packaged dataset."""
    return parse_rows((resources.files("boute.perf") / "data" / "published.csv").read_text())


def in_scope_rows() -> tuple[PublishedRow, ...]:
    return tuple(r for r in published_rows() if r.in_scope)
