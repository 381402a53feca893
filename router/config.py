"""Gateway settings: one frozen pydantic model, filled from ``BOUTE_*`` environment variables and CLI flags.

Every knob has a default that works on one machine; production deployments override through the
environment so the same image runs anywhere (twelve-factor style).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from boute.serving.timeouts import JUDGE_TIMEOUT_S

ENV_PREFIX = "BOUTE_"


class Settings(BaseModel):
    """All gateway settings; ``Settings.from_env()`` reads ``BOUTE_<FIELD>`` (upper case) for each field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan: str | None = Field(None, description="plan file loaded at start-up when Redis holds none")
    backends: str | None = Field(None, description="backend registry file (JSON list of BackendSpec)")
    bundle_root: str | None = Field(
        None,
        description="folder plan bundle paths resolve against for plans sent over Redis/admin (default: the plan file's)",
    )
    redis_url: str | None = Field(None, description="shared state; None = this instance only")
    redis_prefix: str = Field("boute", description="key prefix, so several deployments share one Redis")
    workers: PositiveInt = Field(
        1,
        description="gateway worker processes on one port (SO_REUSEPORT; more than one needs redis_url); the "
        "admission bounds hold for all of them together: each admits its 1/workers share (router.workers)",
    )
    admin_token: str | None = Field(None, description="bearer token for /admin/*; None disables admin")
    max_body_bytes: PositiveInt = Field(1 << 20, description="larger request bodies get 413")
    max_inflight: PositiveInt | None = Field(
        None, description="requests in progress before answering 429; None: the plan's tier bounds summed (>= 1024)"
    )
    tier_queue_per_replica: PositiveInt | None = Field(
        None,
        description="a tier's requests in progress per healthy replica before answering 429 (overload sheds); "
        "None: from the plan (router.admission.planned_inflight)",
    )
    max_scoring_queue: PositiveInt = Field(
        64, description="prompts waiting for a slow (non-inline) scorer before answering 429"
    )
    retry_after_s: PositiveInt = Field(1, description="Retry-After sent with 429/503")
    upstream_timeout_s: PositiveFloat = Field(300.0, description="per-upstream read timeout")
    connect_timeout_s: PositiveFloat = Field(2.0, description="per-upstream connect timeout")
    retries: int = Field(2, ge=0, description="other replicas tried after a failure, before any byte is sent")
    health_interval_s: PositiveFloat = Field(2.0, description="active health check period")
    health_timeout_s: PositiveFloat = Field(1.0, description="active health check timeout")
    cooldown_s: PositiveFloat = Field(5.0, description="the one TTL: how long a tripped replica stays out")
    cb_failures: PositiveInt = Field(3, description="consecutive failures that open a replica's circuit")
    observe_interval_s: PositiveFloat = Field(
        5.0, description="how often what was served is pushed to Redis for re-planning (boute replan)"
    )
    drain_timeout_s: PositiveFloat = Field(30.0, description="graceful shutdown: wait this long for in-flight")
    judge_url: str | None = Field(None, description="cascade: OpenAI-compatible judge endpoint (LLMJudge)")
    judge_model: str | None = Field(
        None, description="cascade: model name sent to the judge endpoint (default: the plan's routing.judge_model)"
    )
    judge_timeout_s: PositiveFloat = Field(
        JUDGE_TIMEOUT_S, description="cascade: an LLM judge slower than this escalates"
    )
    affinity: bool | None = Field(
        None,
        description="cache-aware (prefix-affinity) balancing within a tier: true/false overrides the plan's "
        "'affinity' section (true without one: its defaults); None: as the plan says (absent: least load only)",
    )
    access_log: bool = Field(
        False,
        description="one logfmt line per completion request on the boute.router.access logger, with the route's "
        "reason (x-boute-reason)",
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Environment first, then explicit ``overrides`` (CLI flags) win; ``None`` overrides are ignored."""
        env = os.environ if env is None else env
        data: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None and raw != "":
                data[name] = raw
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)


def workers_problem(workers: int, redis_url: str | None) -> str | None:
    """Why ``workers`` gateway processes cannot serve together, or None: more than one shares its state through
    Redis (a plan PUT on one worker reaches the others only that way)."""
    if workers > 1 and redis_url is None:
        return (
            f"--workers {workers} needs --redis URL (BOUTE_REDIS_URL): the workers share the plan, the backend "
            "registry and replica down-marks through it"
        )
    return None
