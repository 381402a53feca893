"""What an experiment's report shows, as frozen values: gathered from the tracking DB by
:mod:`boute.report.gather`, drawn by :mod:`boute.report.figures` and :mod:`boute.report.diagram`, written out by
:mod:`boute.report.render`. Nothing here reads a file or a database.

Figures are the recorded ones, unrounded (the page rounds what it shows and keeps the exact value beside it).
All latency and throughput figures come from the evaluators: approximate, as the performance model is.
"""

from __future__ import annotations

from dataclasses import dataclass

from boute.specs.targets import Targets


@dataclass(frozen=True)
class ExperimentInfo:
    """The experiment the report is about, as ``boute experiments show`` names it."""

    id: int
    name: str
    scenario: str
    strategy: str
    evaluator: str
    seed: int
    status: str
    created_at: str | None
    objective: str  # the label that chooses the plan: latency | cost | pareto:<prefer>
    mode: str | None  # preroute | cascade


@dataclass(frozen=True)
class Point:
    """One evaluated search trial's figures (by the search's evaluator) and whether they meet the targets."""

    index: int
    quality: float
    p95_s: float
    cost_per_hour: float
    feasible: bool


@dataclass(frozen=True)
class Curve:
    """The best feasible plan so far of one experiment, after each of its evaluations.

    ``evaluations[i]`` evaluations had been made (resumed ones included, screened proposals not: they cost
    none) when ``elapsed_s[i]`` seconds of the experiment's runs had passed (None: recorded before trials
    kept their wall time), and the best feasible plan then scored ``best[i]`` on the report's progress
    figure (:attr:`Report.progress`; None: none feasible yet)."""

    experiment: str
    strategy: str
    seed: int
    evaluations: tuple[int, ...]
    elapsed_s: tuple[float | None, ...]
    best: tuple[float | None, ...]
    this: bool  # the report's own experiment

    @property
    def timed(self) -> bool:
        """Whether every evaluation's wall time was recorded (a curve against wall time can be drawn)."""
        return bool(self.elapsed_s) and all(e is not None for e in self.elapsed_s)


@dataclass(frozen=True)
class Progress:
    """What "best so far" means for the objective: the figure, its unit, and whether lower is better."""

    figure: str  # p95 | cost | hypervolume
    label: str
    lower_is_better: bool
    log_scale: bool


@dataclass(frozen=True)
class Phase:
    """Seconds one phase of the run took (:mod:`boute.optimize.clock`), with its sub-phases."""

    name: str
    seconds: float
    parts: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class GroupBox:
    """One replica group of the plan: ``count`` replicas of ``model`` on ``tp * pp`` ``gpu`` each."""

    index: int  # in the plan's deployment list
    tier: str
    model: str
    gpu: str
    count: int
    tp: int
    pp: int
    dtype: str
    price_per_gpu_hour: float

    @property
    def gpus(self) -> int:
        return self.count * self.tp * self.pp

    @property
    def cost_per_hour(self) -> float:
        """count x tp x pp x the GPU's $/h: the rule the optimiser prices a deployment by."""
        return self.gpus * self.price_per_gpu_hour


@dataclass(frozen=True)
class TierBox:
    """One model tier with the share of requests it is sent (pre-route) or answers (cascade) and its groups."""

    name: str
    share: float | None
    groups: tuple[GroupBox, ...]


@dataclass(frozen=True)
class ChosenPlan:
    """The plan the experiment wrote: its figures (the confirming evaluator's) and its deployment."""

    trial: int | None
    path: str | None
    objective: str | None
    evaluator: str | None
    quality: float | None
    quality_bound: float | None
    p95_s: float | None
    p50_s: float | None
    throughput_rps: float | None
    cost_per_hour: float | None
    feasible: bool | None
    mode: str
    tiers: tuple[TierBox, ...]
    prices_from: str  # where the GPU prices come from (the plan's scenario, or the packaged catalog)

    @property
    def groups(self) -> tuple[GroupBox, ...]:
        return tuple(sorted((g for t in self.tiers for g in t.groups), key=lambda g: g.index))

    @property
    def deployment_cost(self) -> float:
        return sum(g.cost_per_hour for g in self.groups)


@dataclass(frozen=True)
class CheckRow:
    """One of ``boute verify``'s checks: the promise, the measurement, the tolerance, the verdict."""

    name: str
    promised: float | None
    measured: float | None
    tolerance: str
    ok: bool


@dataclass(frozen=True)
class Verification:
    """The latest ``boute verify`` of the chosen plan: promised vs measured, and how the replay ran."""

    ok: bool
    checks: tuple[CheckRow, ...]
    requests: int
    failed: int
    p50_s: float | None
    p95_s: float | None
    rate_rps: float | None
    duration_s: float | None
    gateway: str | None
    notes: tuple[str, ...]
    at: str | None  # when it ran (None: this run, not yet recorded)


@dataclass(frozen=True)
class Report:
    """Everything one experiment's report shows (module doc)."""

    experiment: ExperimentInfo
    targets: Targets
    points: tuple[Point, ...]  # evaluated search trials that gave a result, in order
    front: tuple[Point, ...]  # the quality x P95 x $/h front of the feasible ones
    screened: int
    failed: int
    confirmations: int
    progress: Progress
    curves: tuple[Curve, ...]  # this experiment's first, then the same scenario's others (by strategy)
    phases: tuple[Phase, ...]
    wall_s: float | None  # the run's wall time, when recorded (phases outside it: "other")
    plan: ChosenPlan | None
    verification: Verification | None
    notes: tuple[str, ...]
