"""Named choices of the optimiser, as ``boute optimize`` offers them: evaluators and strategies by name.

:class:`Choices` is a table of names with one help line and one value each, whose lookup fails as the CLI
spells it (``--strategy: unknown strategy 'x' (known: ...)``); the objectives and their ``--prefer`` rules
are such tables (:mod:`boute.optimize.objectives`). A :class:`Registry` is one whose values are
implementations named ``"module:attribute"`` and imported on first use, so listing the choices
(``boute optimize --help``) costs nothing, and the composition root (``boute/cli``) can register an
implementation that lives outside the core (the deployment side's ``live`` evaluator) without the core
importing it. The names are what the tracking DB records. This module imports nothing of the optimiser:
the typed factories live beside what they build (:func:`boute.optimize.evaluators.factory.make_evaluator`,
:func:`boute.optimize.strategies.factory.make_strategy`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Generic, TypeVar

from boute.errors import BouteError

T = TypeVar("T")


class Choices(Generic[T]):
    """``name -> (help, value)`` in the order given: what one option accepts."""

    def __init__(self, kind: str, option: str, entries: Iterable[tuple[str, str, T]] = ()) -> None:
        self.kind, self.option = kind, option
        self._entries: dict[str, tuple[str, T]] = {name: (help, value) for name, help, value in entries}

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str, option: str | None = None) -> T:
        """The value of ``name``; a BouteError naming ``option`` (default: this table's) when it is unknown."""
        if name not in self._entries:
            known = ", ".join(self._entries)
            raise BouteError(f"{option or self.option}: unknown {self.kind} '{name}' (known: {known})")
        return self._entries[name][1]

    def choices(self) -> str:
        """One line for ``--help``: ``name (help) | ...``."""
        return " | ".join(f"{name} ({help})" for name, (help, _) in self._entries.items())


@dataclass(frozen=True)
class Entry:
    name: str
    target: str  # "package.module:attribute", called to build one
    help: str
    fidelity: int = 0  # evaluators: fast 0 < sim 1 < live 2 (confirmations only move up)

    def load(self) -> Callable[..., Any]:
        module, _, attr = self.target.partition(":")
        return getattr(import_module(module), attr)


class Registry(Choices[Entry]):
    """Implementations by name, imported on first use (module doc)."""

    def register(self, name: str, target: str, help: str, fidelity: int = 0) -> None:
        self._entries[name] = (help, Entry(name, target, help, fidelity))

    def entries(self) -> list[Entry]:
        return [entry for _, entry in self._entries.values()]


#: ``target(scenario, mode, *, seed, quality_model, **options) -> Evaluator``
EVALUATORS = Registry("evaluator", "--evaluator")
EVALUATORS.register("fast", "boute.optimize.evaluators.fast:FastEvaluator", "analytical fast path", fidelity=0)
EVALUATORS.register("sim", "boute.optimize.evaluators.sim:SimEvaluator", "event simulator", fidelity=1)
#: evaluators a worker process (or a Ray actor) can rebuild from (name, scenario, mode, seed) alone; the others
#: own external state (``live``: a fleet and a gateway) and are evaluated in the search's own process
POOLABLE = frozenset({"fast", "sim"})

#: ``target(space, *, seed, **options) -> Strategy``
STRATEGIES = Registry("strategy", "--strategy")
STRATEGIES.register("mobo", "boute.optimize.strategies.mobo:MoboStrategy", "exact quality + latency GP")
STRATEGIES.register("mobo-gp", "boute.optimize.strategies.mobo_gp:GPMoboStrategy", "GPs for quality and latency")
STRATEGIES.register("random", "boute.optimize.strategies.random:RandomStrategy", "uniform random plans")
STRATEGIES.register("nsga2", "boute.optimize.strategies.nsga2:NSGA2Strategy", "NSGA-II")
STRATEGIES.register("tpe", "boute.optimize.strategies.tpe:TPEStrategy", "Optuna's constrained TPE")
