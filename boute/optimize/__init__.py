"""BOute's optimiser: find the routing and heterogeneous deployment that meet the targets best.

The public surface is what this module exports; ``docs/optimizer.md`` ("A map of boute/optimize") says what
each module holds. In brief, as BoTorch is shaped:

* the problem: :class:`Space` (the unit box and its decoding into a :class:`Candidate` plan),
  :class:`Objective` (which plan meeting the targets is the answer), :class:`Screen` (known failures kept
  away from the evaluator);
* :mod:`.evaluators`: what a plan is judged by (:class:`Evaluator`, :class:`EvalResult`, :class:`EvalDetail`);
* :mod:`.surrogates` and :mod:`.acquisition`: the models of the outcomes and the acquisition over a pool
  of plans that strategy ``mobo`` builds from them;
* :mod:`.strategies`: what proposes the next plans (:class:`Strategy`), built by name from :data:`STRATEGIES`;
* :mod:`.settings` (:class:`SearchSettings`: one frozen, validated search request, the CLI's defaults);
* :mod:`.loop` (:func:`run_search`), :mod:`.session` (:func:`optimize`: one search, tracked, resumable),
  :mod:`.confirm` (a more faithful evaluator re-checks the answer), :mod:`.plan_run` (:func:`make_plan`:
  search, confirm and write a plan: the entry point of ``boute optimize`` and the re-plan loop).

Exports are imported on first use (PEP 562), so ``import boute.optimize`` (and ``boute --help``, which
reads the registries) stays light: the search's modules pull in numpy, scipy and the quality model.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from boute.optimize.evaluators.base import EvalDetail, EvalResult, Evaluator
    from boute.optimize.evaluators.factory import make_evaluator
    from boute.optimize.loop import LoopHooks, run_search
    from boute.optimize.objectives import OBJECTIVES, PREFERENCES, Objective, make_objective
    from boute.optimize.outcome import Outcome
    from boute.optimize.plan_run import PlanRequest, PlanRun, PlanWorker, RunSummary, make_plan
    from boute.optimize.registry import EVALUATORS, STRATEGIES
    from boute.optimize.screen import Screen, ScreenReport
    from boute.optimize.session import SearchRuntime, optimize
    from boute.optimize.settings import SearchSettings
    from boute.optimize.space import Candidate, Space
    from boute.optimize.status import ExperimentStatus, TrialStatus
    from boute.optimize.strategies.base import Strategy
    from boute.optimize.strategies.factory import make_strategy
    from boute.optimize.trial_store import TrialStore
    from boute.optimize.trials import Trial

#: export -> the module that defines it
_WHERE = {
    "make_plan": "plan_run",
    "PlanRequest": "plan_run",
    "PlanRun": "plan_run",
    "PlanWorker": "plan_run",
    "RunSummary": "plan_run",
    "SearchSettings": "settings",
    "optimize": "session",
    "SearchRuntime": "session",
    "Outcome": "outcome",
    "run_search": "loop",
    "LoopHooks": "loop",
    "EVALUATORS": "registry",
    "STRATEGIES": "registry",
    "OBJECTIVES": "objectives",
    "PREFERENCES": "objectives",
    "make_evaluator": "evaluators.factory",
    "make_strategy": "strategies.factory",
    "Space": "space",
    "Candidate": "space",
    "Objective": "objectives",
    "make_objective": "objectives",
    "Screen": "screen",
    "ScreenReport": "screen",
    "TrialStatus": "status",
    "ExperimentStatus": "status",
    "TrialStore": "trial_store",
    "Strategy": "strategies.base",
    "Evaluator": "evaluators.base",
    "EvalResult": "evaluators.base",
    "EvalDetail": "evaluators.base",
    "Trial": "trials",
}

__all__ = [
    "Candidate",
    "EVALUATORS",
    "EvalDetail",
    "EvalResult",
    "Evaluator",
    "ExperimentStatus",
    "LoopHooks",
    "OBJECTIVES",
    "Objective",
    "Outcome",
    "PREFERENCES",
    "PlanRequest",
    "PlanRun",
    "PlanWorker",
    "RunSummary",
    "STRATEGIES",
    "Screen",
    "ScreenReport",
    "SearchRuntime",
    "SearchSettings",
    "Space",
    "Strategy",
    "Trial",
    "TrialStatus",
    "TrialStore",
    "make_evaluator",
    "make_objective",
    "make_plan",
    "make_strategy",
    "optimize",
    "run_search",
]


def __getattr__(name: str) -> Any:
    """An export, imported from its module on first use (module doc)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'boute.optimize' has no attribute {name!r}")
    value = getattr(import_module(f"boute.optimize.{where}"), name)
    globals()[name] = value
    return value
