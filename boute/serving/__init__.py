"""The serving contract: what the gateway (``router/``) and the deployers (``backends/``) agree on.

The two sides meet only over HTTP and Redis; the schemas of what crosses (a backend registry entry, the
Redis key layout, the streaming relay both answer with) are defined once, here, so neither side imports
the other (the layer contract in pyproject.toml, checked by ``make lint``).
"""

from boute.serving.registry import BACKENDS, BackendSpec, RedisKeys

__all__ = ["BACKENDS", "BackendSpec", "RedisKeys"]
