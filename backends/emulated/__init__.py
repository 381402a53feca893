"""A CPU stand-in for an SGLang server: OpenAI + SGLang-native API, perf-model timing, continuous batching.

Use it to run the whole stack (gateway, balancing, failures) on a laptop: ``python -m backends.emulated``.
Timing is as approximate as ``boute.perf`` is; answers are recorded responses of a quality profile.
"""

from backends.emulated.engine import Engine, Sequence
from backends.emulated.profile import ReplicaConfig, Responder

__all__ = ["Engine", "ReplicaConfig", "Responder", "Sequence", "create_app"]


def create_app(*args, **kwargs):  # noqa: ANN002, ANN003 - lazy: keeps `import backends.emulated` light
    from backends.emulated.app import create_app as _create

    return _create(*args, **kwargs)
