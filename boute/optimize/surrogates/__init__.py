"""Models of the search's outcomes, in BoTorch's terms: what MOBO knows exactly and what it learns.

* :mod:`.exact`: outcomes known before any evaluation (quality from the quality model, ``-$/h`` from the
  deployment) as deterministic BoTorch models, so objectives and constraints on them are exact inside an
  acquisition.
* :mod:`.latency`: the GP on ``-log P95`` (strategy ``mobo``), warm-started between steps.
* :mod:`.prior`: a cheaper evaluator's ``-log P95`` as the GP's known mean: the GP then models only the
  residual, ``y(x) = prior(x) + r(x)``, ``r ~ GP``.
* :mod:`.outcomes`: one GP per outcome, ``logit(quality)`` and ``-log P95`` (strategy ``mobo-gp``).
* :mod:`.warm`: what a refit starts from.

Torch and BoTorch are imported only when a model is built: importing these modules stays light.
"""

from boute.optimize.surrogates.exact import ExactQuality, QualityFn, exact_quality_fn, lookup, pointwise
from boute.optimize.surrogates.latency import LatencyGP, latency_outcome
from boute.optimize.surrogates.outcomes import OutcomeGPs, logit
from boute.optimize.surrogates.prior import PriorLatency
from boute.optimize.surrogates.warm import warm_state

__all__ = [
    "ExactQuality",
    "LatencyGP",
    "OutcomeGPs",
    "PriorLatency",
    "QualityFn",
    "exact_quality_fn",
    "latency_outcome",
    "logit",
    "lookup",
    "pointwise",
    "warm_state",
]
