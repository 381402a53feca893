"""How a tier's load is shared among its replicas, beyond capacity-weighted least load: the cache-aware
(prefix-affinity) rule's settings. A scenario's ``balancing`` section names the balancing its plans are
judged under, and the plan carries it to the gateway (:class:`boute.specs.plan.Plan`), so the promise and
the serving use one rule (:mod:`boute.sim.affinity`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Affinity(_Frozen):
    """Cache-aware balancing within a tier (:mod:`boute.sim.affinity` states the rule and its math).

    SGLang replicas keep a radix cache of the prompts they served, so a request whose prompt shares a long
    prefix with an earlier one (a shared system prompt, a conversation's earlier turns) is cheaper on the
    replica that served it. With affinity on, a request goes to the replica whose recent prompts share the
    longest prefix with its own, unless the tier's load is imbalanced beyond both thresholds (absolute AND
    relative, as sglang-router's ``balance_abs_threshold`` / ``balance_rel_threshold``) or the match is short;
    then the least-load rule of :class:`Balance` decides. Absent from a plan: off (least load only).

    Defaults, and why: ``min_match`` 0.3 and ``balance_rel`` 1.5 are sglang-router's (``cache_threshold``,
    ``balance_rel_threshold``); ``balance_abs`` is half its 64, because a gateway process counts only its own
    outstanding requests (several workers or gateways each see a share of a replica's load). ``block_chars``
    256 (~64 tokens) x ``max_blocks`` 32 hashes at most 8,192 characters (~2k tokens) per request, which bounds
    what affinity adds to a request at ~47 us however long its prompt (``python -m bench affinity``).
    """

    enabled: bool = Field(True, description="route by prefix affinity (false: keep the figures, balance by load)")
    block_chars: int = Field(
        256, ge=16, le=65536, description="characters of prompt text per hashed block (the match's granularity)"
    )
    max_blocks: int = Field(
        32, ge=1, le=4096, description="leading blocks hashed per prompt: bounds the cost of a huge prompt"
    )
    min_match: float = Field(
        0.3, ge=0.0, le=1.0, description="shortest match, as a share of the hashed prompt, routed by affinity"
    )
    balance_abs: float = Field(
        32.0,
        ge=0.0,
        description="imbalance needs max - min outstanding requests per unit of capacity above this (and balance_rel)",
    )
    balance_rel: float = Field(
        1.5,
        ge=1.0,
        description="imbalance needs max above this times min (and balance_abs); also the bounded-load factor for "
        "a new prefix's replica",
    )
    index_blocks: int = Field(
        65536, ge=16, le=1 << 24, description="prefix blocks remembered per tier (least recently used forgotten)"
    )
