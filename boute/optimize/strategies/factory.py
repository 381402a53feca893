"""A strategy by its registered name (:data:`boute.optimize.registry.STRATEGIES`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from boute.optimize.registry import STRATEGIES
from boute.optimize.strategies.base import Strategy

if TYPE_CHECKING:
    from boute.optimize.space import Space


def make_strategy(name: str, space: Space, seed: int = 0, **options: Any) -> Strategy:
    """The strategy called ``name`` for ``space``; ``options`` go to its constructor."""
    strategy: Strategy = STRATEGIES.get(name).load()(space, seed=seed, **options)
    return strategy
