"""Quality side of BOute: profiles, the learned router, judges, and the quality of a routing policy.

Light to import (numpy only); torch/transformers/scikit-learn load inside the functions that need them.

- :func:`load_profile` -> :class:`QualityProfile` (RouteLLM CSV, MT-Bench judgements, plain JSONL)
- :func:`quality_model_for` (scenario) -> :class:`QualityModel` with ``preroute``/``cascade``/``assign``
- :func:`load_router` -> :class:`Router` (``score(prompts)``: difficulty in [0, 1]), the ladder's scorer
- :func:`boute.quality.multi.load_multi_router` -> the multi router (``predict(prompts)``: each tier's
  predicted correctness); which of the two pre-routes is the scenario's ``quality.router_kind``
  (:mod:`boute.quality.preroute`)
- :data:`boute.quality.router_kinds.ROUTER_KINDS`: one class per plan scorer (``ladder``, ``multi``, ``length``),
  what the gateway, the optimiser and the re-plan loop ask of a kind of router
- :class:`LLMJudge` (any OpenAI-compatible endpoint), :class:`OfflineVerifier` (learned, offline)
"""

from boute.quality.build import build_quality_model, quality_model_for
from boute.quality.judges import LLMJudge, OfflineVerifier, VerifierJudge, load_verifier, parse_rating
from boute.quality.policy_quality import PolicyResult, QualityModel
from boute.quality.profiles import QualityProfile, load_profile
from boute.quality.router import Router, load_router, train_router

__all__ = [
    "LLMJudge",
    "OfflineVerifier",
    "VerifierJudge",
    "PolicyResult",
    "QualityModel",
    "QualityProfile",
    "Router",
    "build_quality_model",
    "load_profile",
    "load_router",
    "load_verifier",
    "parse_rating",
    "quality_model_for",
    "train_router",
]
