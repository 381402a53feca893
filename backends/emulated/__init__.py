"""A CPU stand-in for an SGLang server: OpenAI + SGLang-native API, perf-model timing, continuous batching.

Use it to run the whole stack (gateway, balancing, failures) on a laptop: ``python -m backends.emulated``.
Timing is as approximate as ``boute.perf`` is; answers are recorded responses of a quality profile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from backends.emulated.engine import Engine, Sequence
from backends.emulated.profile import ReplicaConfig, Responder

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["Engine", "ReplicaConfig", "Responder", "Sequence", "create_app"]


def create_app(*args: Any, **kwargs: Any) -> Starlette:
    from backends.emulated.app import create_app as _create

    return _create(*args, **kwargs)
