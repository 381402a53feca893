"""The backend registry entry and the Redis key layout shared by gateways and deployers.

Layout under a prefix ``P`` (default ``boute``, so several deployments share one Redis):

- ``P:backends``: one JSON list of :class:`BackendSpec` (the registry; writers replace it under WATCH);
- ``P:plan``: ``{"version", "plan"}``, the active plan, its version taken from ``P:plan:version`` (INCR);
- ``P:down:<backend id>``: set with the cooldown as TTL when a gateway trips a replica;
- ``P:events``: the pub/sub channel; messages ``{"kind": "plan"|"backends"|"down", ...}``;
- ``P:artifact:<sha256>``: the bytes of a plan bundle's file, so every gateway can load the plan's router;
- ``P:observations``: a capped list of what each gateway served per interval (``boute.replan.window``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, TypeAdapter

#: the Redis a deployment shares its state through unless told otherwise (``--redis`` / ``BOUTE_REDIS_URL``)
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class BackendSpec(BaseModel):
    """One serving replica the gateway may send to: its URL, tier, and (for weights) its hardware."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(pattern=r"^https?://")
    tier: str
    model: str = Field(description="model name sent upstream (the backend's served model name)")
    gpu: str | None = None
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    dtype: str = "bf16"
    name: str | None = None

    @property
    def id(self) -> str:
        return self.name or self.url


BACKENDS = TypeAdapter(list[BackendSpec])


@dataclass(frozen=True)
class RedisKeys:
    """The keys of one deployment's shared state in Redis."""

    prefix: str = "boute"

    @property
    def backends(self) -> str:
        return f"{self.prefix}:backends"

    @property
    def plan(self) -> str:
        return f"{self.prefix}:plan"

    @property
    def plan_version(self) -> str:
        return f"{self.prefix}:plan:version"

    @property
    def down_prefix(self) -> str:
        return f"{self.prefix}:down:"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"

    @property
    def observations(self) -> str:
        return f"{self.prefix}:observations"

    def artifact(self, sha256: str) -> str:
        return f"{self.prefix}:artifact:{sha256}"
