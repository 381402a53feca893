"""What one system's run returns: its chosen plan, the pool it searched, and the cost of the search.

Its own module because every system returns one: :mod:`experiments.systems` (which dispatches to each)
and :mod:`experiments.cascadia` (one of them) both import it, and neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SystemRun:
    system: str
    mode: str
    chosen: Any  # Candidate | None: the plan the system deploys
    chosen_result: Any  # EvalResult | None (by the evaluator the system searched with)
    pool: list[tuple[Any, Any]] = field(default_factory=list)  # (Candidate, EvalResult) evaluated
    evals: int = 0
    wall_s: float = 0.0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
