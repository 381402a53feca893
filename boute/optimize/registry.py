"""Registries of evaluators and search strategies: what ``boute optimize`` offers, by name.

Entries name their implementation as ``"module:attribute"`` and import it on first use, so listing the
choices (``boute optimize --help``) costs nothing, and the composition root (``boute/cli``) can register an
implementation that lives outside the core (the deployment side's ``live`` evaluator) without the core
importing it. The names are what the tracking DB records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

from boute.errors import BouteError

if TYPE_CHECKING:
    from boute.optimize.evaluators.base import Evaluator
    from boute.optimize.space import Space
    from boute.optimize.strategies.base import Strategy
    from boute.quality.policy_quality import QualityModel
    from boute.specs import Scenario


@dataclass(frozen=True)
class Entry:
    name: str
    target: str  # "package.module:attribute", called to build one
    help: str
    fidelity: int = 0  # evaluators: fast 0 < sim 1 < live 2 (confirmations only move up)

    def load(self) -> Callable[..., Any]:
        module, _, attr = self.target.partition(":")
        return getattr(import_module(module), attr)


class Registry:
    def __init__(self, kind: str, option: str) -> None:
        self.kind, self.option = kind, option
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, target: str, help: str, fidelity: int = 0) -> None:
        self._entries[name] = Entry(name, target, help, fidelity)

    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def get(self, name: str, option: str | None = None) -> Entry:
        if name not in self._entries:
            known = ", ".join(self._entries)
            raise BouteError(f"{option or self.option}: unknown {self.kind} '{name}' (known: {known})")
        return self._entries[name]

    def choices(self) -> str:
        """One line for ``--help``: ``name (help) | ...``."""
        return " | ".join(f"{e.name} ({e.help})" for e in self._entries.values())


#: ``target(scenario, mode, *, seed, quality_model, **options) -> Evaluator``
EVALUATORS = Registry("evaluator", "--evaluator")
EVALUATORS.register("fast", "boute.optimize.evaluators.fast:FastEvaluator", "analytical fast path", fidelity=0)
EVALUATORS.register("sim", "boute.optimize.evaluators.sim:SimEvaluator", "event simulator", fidelity=1)

#: ``target(space, *, seed, **options) -> Strategy``
STRATEGIES = Registry("strategy", "--strategy")
STRATEGIES.register("mobo", "boute.optimize.strategies.mobo:MoboStrategy", "exact quality + latency GP")
STRATEGIES.register("mobo-gp", "boute.optimize.strategies.mobo_gp:GPMoboStrategy", "GPs for quality and latency")
STRATEGIES.register("random", "boute.optimize.strategies.random:RandomStrategy", "uniform random plans")
STRATEGIES.register("nsga2", "boute.optimize.strategies.nsga2:NSGA2Strategy", "NSGA-II")
STRATEGIES.register("tpe", "boute.optimize.strategies.tpe:TPEStrategy", "Optuna's constrained TPE")


def make_strategy(name: str, space: Space, seed: int = 0, **options: Any) -> Strategy:
    """The strategy called ``name`` for ``space``; ``options`` go to its constructor."""
    strategy: Strategy = STRATEGIES.get(name).load()(space, seed=seed, **options)
    return strategy


def make_evaluator(
    name: str,
    scenario: Scenario,
    mode: str = "preroute",
    seed: int = 0,
    *,
    quality_model: QualityModel | None = None,
    **options: Any,
) -> Evaluator:
    """The evaluator called ``name``; ``options`` go to it (e.g. the live one's ``redis_url``)."""
    factory = EVALUATORS.get(name).load()
    evaluator: Evaluator = factory(scenario, mode, seed=seed, quality_model=quality_model, **options)
    return evaluator


#: what ``boute optimize --objective`` minimises among plans meeting the targets (boute/optimize/objectives.py)
OBJECTIVES = Registry("objective", "--objective")
OBJECTIVES.register("latency", "boute.optimize.objectives:make_objective", "lowest P95 (the paper's method)")
OBJECTIVES.register("cost", "boute.optimize.objectives:make_objective", "lowest $/h")
OBJECTIVES.register("pareto", "boute.optimize.objectives:make_objective", "quality x P95 x $/h front, --prefer picks")

#: how ``--objective pareto`` picks the plan from the feasible front (``--prefer``)
PREFERENCES = Registry("rule", "--prefer")
PREFERENCES.register("knee", "boute.optimize.objectives:prefer_knee", "nearest the ideal, axes scaled target..best")
PREFERENCES.register("cost", "boute.optimize.objectives:prefer_cost", "cheapest")
PREFERENCES.register("latency", "boute.optimize.objectives:prefer_latency", "lowest P95")
PREFERENCES.register("quality", "boute.optimize.objectives:prefer_quality", "highest quality")
