"""How one search runs: :class:`SearchSettings`, one frozen, validated request from the CLI to the loop.

``boute optimize``'s options, :func:`boute.optimize.plan_run.make_plan`, :func:`boute.optimize.session.optimize`
and :func:`boute.optimize.loop.run_search` all take this one object whole (as BoTorch's
``OptimizeAcqfInputs`` gathers ``optimize_acqf``'s arguments), so each default is written once, here, and
the CLI's options take their defaults, flags and help from its fields (:func:`default_of`, :func:`option_of`,
:func:`help_of`). A request
that cannot run never exists: construction checks it and raises a BouteError naming the option at fault
as ``boute optimize`` spells it (``--max-evals: must be >= 1, got 0``).

Plain values only (names, numbers), so a request can go to a worker process; what is not a setting (an
evaluator instance, the tracking store, callbacks, the clock) travels beside it
(:class:`boute.optimize.session.SearchRuntime`). This module imports nothing heavy: the CLI reads it to
draw ``--help``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from boute.errors import BouteError
from boute.optimize.objectives import OBJECTIVES, PREFERENCES, Objective, objective_of_options
from boute.optimize.registry import EVALUATORS, POOLABLE, STRATEGIES


def _option(default: Any, flag: str, help: str = "") -> Any:
    """A field that is also an option of ``boute optimize``: its flag and help ride on the field."""
    return field(default=default, metadata={"option": flag, "help": help})


@dataclass(frozen=True)
class SearchSettings:
    """What to search for and how (module doc); the fields are ``boute optimize``'s options of the same
    names. ``gpus`` (restrict the space to these GPU types), ``strategy_options`` (passed to the
    strategy's constructor) and ``pipeline`` (the schedule) are the library's only."""

    strategy: str = _option("mobo", "--strategy")
    evaluator: str = _option(
        "sim",
        "--evaluator",
        "what the search optimises (the simulator by default, with the fast path as the GP's prior): ",
    )
    max_evals: int = _option(60, "--max-evals", "evaluation budget")
    objective: str = _option(
        "latency", "--objective", "what to optimise among plans meeting the targets: " + OBJECTIVES.choices()
    )
    prefer: str | None = _option(
        None,
        "--prefer",
        "--objective pareto: the rule picking the plan from the front (default knee): " + PREFERENCES.choices(),
    )
    screen: bool = _option(
        True,
        "--screen/--no-screen",
        "move proposals onto the quality floor and skip plans over the capacity bound before evaluating",
    )
    batch: int = _option(4, "--batch", "proposals per search step, evaluated together")
    #: None: the cores this process may use (with ray_address: the cluster's CPUs)
    workers: int | None = _option(
        None,
        "--workers",
        "processes evaluating a batch (default: the cores this process may use; with --ray-address, "
        "the cluster's CPUs)",
    )
    ray_address: str | None = _option(
        None,
        "--ray-address",
        "evaluate batches on this Ray cluster's actors (auto, HOST:PORT or ray://HOST:10001; every node "
        "needs BOute installed); raise --batch with its size",
    )
    time_budget_s: float | None = _option(
        None,
        "--time-budget",
        "search for at most this many seconds: no step is started that would end past it, as the last steps' "
        "durations tell (the plan is still confirmed after)",
    )
    overlap: bool = _option(
        False,
        "--overlap/--no-overlap",
        "propose the next batch while this one is evaluated (it sees this one as pending); pays where "
        "evaluations have cores of their own (a Ray cluster): on 2 cores the default schedule was faster",
    )
    mode: str = _option("preroute", "--mode", "routing mode: preroute | cascade")
    seed: int = _option(
        0, "--seed", "the search's seed (where it looks); the simulated traffic is the scenario's workload.seed"
    )
    experiment: str | None = _option(None, "--experiment", "experiment name; an existing one resumes")
    #: None (or 0, as the CLI spells it): never stop early
    patience: int | None = _option(20, "--patience", "stop when the chosen plan is unchanged this long (0: never)")
    confirm: bool = _option(True, "--confirm/--no-confirm", "re-evaluate the best front points")
    confirm_with: str = _option("sim", "--confirm-with", "a more faithful evaluator than --evaluator: ")
    max_confirm: int = _option(
        12,
        "--max-confirm",
        "confirming evaluations in all: the best 4 plans, then a search with the confirming evaluator",
    )
    gpus: tuple[str, ...] | None = None
    strategy_options: Mapping[str, Any] = field(default_factory=dict)
    #: the schedule (:mod:`boute.optimize.loop`): True, batch k+1 is proposed with batch k pending and the
    #: results up to batch k-1, so it can be proposed while batch k is evaluated (``overlap``); False, with
    #: batch k's results (nothing overlaps). None: pipelined with ``overlap`` where evaluations run outside the
    #: search's process (:data:`~boute.optimize.registry.POOLABLE`; the live evaluator's run in turn here).
    #: ``pipeline=True, overlap=False`` runs the pipelined schedule one step after the other: the same trials
    #: as with ``overlap`` (a test compares them)
    pipeline: bool | None = None

    def __post_init__(self) -> None:
        if self.patience == 0:
            object.__setattr__(self, "patience", None)
        if self.pipeline is None:
            object.__setattr__(self, "pipeline", self.overlap and self.evaluator in POOLABLE)
        self.check()

    def check(self) -> None:
        """BouteError naming the option at fault (as ``boute optimize`` spells it) for settings that cannot run."""
        STRATEGIES.get(self.strategy)
        objective_of_options(self.objective, self.prefer)
        EVALUATORS.get(self.evaluator)
        EVALUATORS.get(self.confirm_with, option_of("confirm_with"))
        if self.ray_address is not None and self.evaluator not in POOLABLE:
            raise BouteError(
                f"{option_of('ray_address')}: the {self.evaluator} evaluator runs in this process; "
                f"only {', '.join(sorted(POOLABLE))} evaluations go to a Ray cluster"
            )
        from boute.specs.plan import ROUTING_MODES

        if self.mode not in ROUTING_MODES:
            raise BouteError(
                f"{option_of('mode')}: unknown routing mode '{self.mode}' (known: {', '.join(ROUTING_MODES)})"
            )
        for name in ("max_evals", "max_confirm"):
            if getattr(self, name) < 1:
                raise BouteError(f"{option_of(name)}: must be >= 1, got {getattr(self, name)}")

    @property
    def chosen_by(self) -> Objective:
        """The objective that picks the answer (:mod:`boute.optimize.objectives`)."""
        return Objective(self.objective, self.prefer or "knee")


def option_decl(name: str) -> str:
    """The ``boute optimize`` option of the field ``name`` as Typer declares it (``--screen/--no-screen``)."""
    decl: str = _FIELDS[name].metadata["option"]
    return decl


def option_of(name: str) -> str:
    """The ``boute optimize`` flag of the field ``name`` (``max_evals`` -> ``--max-evals``)."""
    return option_decl(name).split("/")[0]


def help_of(name: str) -> str:
    """The help line of the field ``name``, as ``boute optimize --help`` shows it."""
    text: str = _FIELDS[name].metadata["help"]
    return text


def default_of(name: str) -> Any:
    """The default of the field ``name`` (read off the class: no settings are built, nothing is imported)."""
    return _FIELDS[name].default


_FIELDS = {f.name: f for f in fields(SearchSettings)}
