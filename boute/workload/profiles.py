"""Prompt and response lengths of a quality profile (the paper's workload: GSM8K prompts + recorded responses).

The profile is read by :func:`boute.quality.profiles.load_profile`, the one reader of every profile format
(RouteLLM CSV, RouterBench CSV, MT-Bench judgements, plain JSONL), so row ``i`` here is row ``i`` of the
quality profile and a request's ``prompt_index`` lets the quality model look up that very prompt.

Input length of a query = the token count of what an engine prefills for it
(:attr:`QualityProfile.served_prompts`: the prompt; for MT-Bench turn 2 the whole conversation so far,
Q1, A1, Q2). Output length, per tier: where the profile records every tier model's response
(``Tier.quality_model``, else the tier name), tier k answers a prompt with as many tokens as its model's
recorded response (:attr:`ProfileLengths.tier_output_tokens`): a cascade hop generates its own tier's
answer, and a pre-routed prompt is as long as the answer of the tier it is sent to. That is what an engine
serving those models does, and what the emulated backend replays. MT-Bench shows why one length per prompt
is not enough: GPT-4's answers average 382 tokens, Mixtral's 285, so a cascade whose small tier answers
every prompt was simulated with a sixth more decode on that tier than it runs. ``output_tokens`` is the mean over the
tier models' responses (the single length the capacity rule and the load moments use); if none of them
has a recorded response, the mean over all recorded responses, and the tiers share it.

Where the profile records conversations (``QualityProfile.follows``), ``own_input_tokens`` counts each query's
prompt alone (MT-Bench turn 2 without turn 1's answer) and ``next_turn`` names the query that follows: what a
scenario's conversations ask as the next turn (:mod:`boute.workload.prefixes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from boute.data import data_path
from boute.errors import SpecError
from boute.workload.tokens import cached_counts

_READER_VERSION = "boute.quality.profiles/2"


@dataclass(frozen=True)
class ProfileLengths:
    input_tokens: np.ndarray  # int64 per profile row
    output_tokens: np.ndarray  # int64 per profile row (mean over the chosen models' responses)
    models: tuple[str, ...]  # whose responses were averaged
    #: int64 (rows, tiers): each requested model's own response length, where every one has responses
    tier_output_tokens: np.ndarray | None = None
    #: int64 per row: tokens of the query's own prompt, without the earlier turns ``input_tokens`` counts
    #: (what a recorded conversation's next turn adds to it); None: the same as ``input_tokens``
    own_input_tokens: np.ndarray | None = None
    #: int64 per row: the row of the recorded turn that follows it in its conversation, -1 none
    #: (:meth:`QualityProfile.next_turns`); None: no query follows another
    next_turn: np.ndarray | None = None


@dataclass(frozen=True)
class _Counts:
    served: np.ndarray  # tokens an engine prefills per row
    own: np.ndarray | None  # tokens of the row's own prompt where that is less (earlier turns), else None
    responses: dict[str, np.ndarray]
    next_turn: np.ndarray | None


@lru_cache(maxsize=8)
def _profile_counts(path: Path, fmt: str, mtime_ns: int) -> _Counts:
    from boute.quality.profiles import load_profile

    profile = load_profile(path, fmt)
    cols = {"__prompt__": list(profile.served_prompts), **{f"r:{m}": list(t) for m, t in profile.responses.items()}}
    if profile.contexts:
        cols["__own__"] = list(profile.prompts)
    # the reader's version is in the key: a change of what it reads (MT-Bench contexts) is a cache miss
    counts = cached_counts([_READER_VERSION, profile.format, path.read_bytes()], cols)
    nxt = profile.next_turns() if profile.records_conversations else None
    return _Counts(counts["__prompt__"], counts.get("__own__"), {m: counts[f"r:{m}"] for m in profile.responses}, nxt)


def profile_lengths(
    profile: str, fmt: str = "auto", models: tuple[str, ...] = (), base: Path | None = None
) -> ProfileLengths:
    """Token lengths of a profile's prompts and of the responses of ``models`` (see module doc)."""
    path = data_path(profile, base)
    if not path.is_file():
        raise SpecError(path, None, "quality profile not found")
    counts = _profile_counts(path.resolve(), fmt, path.stat().st_mtime_ns)
    prompt_counts, response_counts = counts.served, counts.responses
    chosen = tuple(m for m in models if m in response_counts) or tuple(sorted(response_counts))
    if not chosen:
        raise SpecError(path, None, "the profile records no responses, so output lengths are unknown")
    out = np.rint(np.mean([response_counts[m] for m in chosen], axis=0)).astype(np.int64)
    per_tier = None
    if models and all(m in response_counts for m in models):
        per_tier = np.maximum(np.stack([response_counts[m] for m in models], axis=1).astype(np.int64), 1)
    own = None if counts.own is None else counts.own.copy()
    nxt = None if counts.next_turn is None else counts.next_turn.copy()
    return ProfileLengths(prompt_counts.copy(), np.maximum(out, 1), chosen, per_tier, own, nxt)
