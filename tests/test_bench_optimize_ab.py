"""The interleaved A/B benchmark's summary (bench/bench_optimize_ab.py): medians per side, the ratio, and
whether both sides made the same search."""

from __future__ import annotations

from typing import Any

from bench.bench_optimize_ab import _summary


def _row(side: str, wall: float, p95: float = 3.3, seed: int = 0) -> dict[str, Any]:
    return {"scenario": "s", "seed": seed, "side": side, "wall_s": wall, "p95_s": p95, "evaluations": 60, "pool_s": 1.0}


def test_the_summary_takes_medians_per_side_and_flags_a_different_search() -> None:
    rows = [_row("ref", 10.0), _row("tree", 8.0), _row("ref", 14.0), _row("tree", 9.0), _row("ref", 12.0)]
    rows += [_row("tree", 7.0, seed=1), _row("ref", 10.0, p95=3.5, seed=1)]
    same, other = _summary(rows)
    assert same["wall_s"] == {"ref": 12.0, "tree": 8.5} and same["wall_ratio"] == round(8.5 / 12.0, 3)
    assert same["same_search"] and not other["same_search"]
    assert other["p95_s"] == {"ref": 3.5, "tree": 3.3}
