"""Evaluators of a candidate plan, of rising cost and truth, behind one protocol.

* :mod:`.base`: the :class:`Evaluator` protocol, :class:`EvalResult` and its typed :class:`EvalDetail`.
* :mod:`.fast`: ``fast``, the quality model + the analytical queueing fast path (milliseconds).
* :mod:`.sim`: ``sim``, the quality model + the discrete-event simulator (seconds).
* :mod:`.pool`: evaluations in parallel, one evaluator per worker process.

The ``live`` evaluator (real deployments) lives on the deployment side (``backends/deploy/live_eval.py``):
the core never imports it; the CLI registers it in :data:`boute.optimize.registry.EVALUATORS`.
"""

from boute.optimize.evaluators.base import (
    OVERLOAD_P95_S,
    EvalDetail,
    EvalResult,
    Evaluator,
    candidate_plan,
    judge_delay_of,
    llm_judge_of,
    policy_of,
    router_files_of,
    router_of,
    scorer_of,
    verifier_of,
)
from boute.optimize.evaluators.fast import FastEvaluator
from boute.optimize.evaluators.pool import EvaluatorPool, default_workers
from boute.optimize.evaluators.sim import SimEvaluator

__all__ = [
    "OVERLOAD_P95_S",
    "EvalDetail",
    "EvalResult",
    "Evaluator",
    "EvaluatorPool",
    "FastEvaluator",
    "SimEvaluator",
    "candidate_plan",
    "default_workers",
    "judge_delay_of",
    "llm_judge_of",
    "policy_of",
    "router_files_of",
    "router_of",
    "scorer_of",
    "verifier_of",
]
