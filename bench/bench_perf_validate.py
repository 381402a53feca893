"""Held-out error of the performance model on published serving measurements (issue 13).

Goal: leave-one-source-out median absolute error <= 10% and 90th percentile <= 25%, per metric and GPU
family. Runs the same report as ``boute perf validate --json`` (full re-fits per held-out source and GPU;
quick mode: leave-one-source-out only).
"""

from __future__ import annotations

from typing import Any


def run(quick: bool) -> dict[str, Any]:
    from boute.perf.validate import report

    rep = report(splits=("source",) if quick else ("source", "gpu"))
    rep["goal"] = "leave-one-source-out median |error| <= 10%, p90 <= 25% (per metric and GPU family)"
    return rep
