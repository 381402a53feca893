"""Prompt and response lengths of a quality profile (the paper's workload: GSM8K prompts + recorded responses).

The profile is read by :func:`boute.quality.profiles.load_profile`, the one reader of every profile format
(RouteLLM CSV, RouterBench CSV, MT-Bench judgements, plain JSONL), so row ``i`` here is row ``i`` of the
quality profile and a request's ``prompt_index`` lets the quality model look up that very prompt.

Input length of a query = the token count of what an engine prefills for it
(:attr:`QualityProfile.served_prompts`: the prompt; for MT-Bench turn 2 the whole conversation so far,
Q1, A1, Q2). Output length = the mean token count of the responses recorded for the scenario's tier models
(``Tier.quality_model``, else the tier name); if none of them has a recorded response, the mean over all
recorded responses. A single length per prompt keeps cascades simple (every hop generates about as much
as the final answer); the large and small models' GSM8K responses differ by ~10% on average.
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


@lru_cache(maxsize=8)
def _profile_counts(path: Path, fmt: str, mtime_ns: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    from boute.quality.profiles import load_profile

    profile = load_profile(path, fmt)
    cols = {"__prompt__": list(profile.served_prompts), **{f"r:{m}": list(t) for m, t in profile.responses.items()}}
    # the reader's version is in the key: a change of what it reads (MT-Bench contexts) is a cache miss
    counts = cached_counts([_READER_VERSION, profile.format, path.read_bytes()], cols)
    return counts["__prompt__"], {m: counts[f"r:{m}"] for m in profile.responses}


def profile_lengths(
    profile: str, fmt: str = "auto", models: tuple[str, ...] = (), base: Path | None = None
) -> ProfileLengths:
    """Token lengths of a profile's prompts and of the responses of ``models`` (see module doc)."""
    path = data_path(profile, base)
    if not path.is_file():
        raise SpecError(path, None, "quality profile not found")
    prompt_counts, response_counts = _profile_counts(path.resolve(), fmt, path.stat().st_mtime_ns)
    chosen = tuple(m for m in models if m in response_counts) or tuple(sorted(response_counts))
    if not chosen:
        raise SpecError(path, None, "the profile records no responses, so output lengths are unknown")
    out = np.rint(np.mean([response_counts[m] for m in chosen], axis=0)).astype(np.int64)
    return ProfileLengths(prompt_counts.copy(), np.maximum(out, 1), chosen)
