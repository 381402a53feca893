"""Warm starts: a GP's next fit begins from the last fit's hyperparameters (they move little per step)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor
    from torch.nn import Module


def warm_state(gp: Module) -> dict[str, Tensor]:
    """A copy of ``gp``'s state without its outcome transform: the next step's GP loads it as a warm start,
    while its ``Standardize`` is refitted to the new data (loaded, the old scaling would be wrong)."""
    return {k: v.detach().clone() for k, v in gp.state_dict().items() if not k.startswith("outcome_transform")}
