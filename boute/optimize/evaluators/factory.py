"""An evaluator by its registered name (:data:`boute.optimize.registry.EVALUATORS`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from boute.optimize.evaluators.base import Evaluator
from boute.optimize.registry import EVALUATORS

if TYPE_CHECKING:
    from boute.quality.policy_quality import QualityModel
    from boute.specs import Scenario


def make_evaluator(
    name: str,
    scenario: Scenario,
    mode: str = "preroute",
    seed: int = 0,
    *,
    quality_model: QualityModel | None = None,
    **options: Any,
) -> Evaluator:
    """The evaluator called ``name``; ``options`` go to it (e.g. the live one's ``redis_url``)."""
    factory = EVALUATORS.get(name).load()
    evaluator: Evaluator = factory(scenario, mode, seed=seed, quality_model=quality_model, **options)
    return evaluator
