"""What a search produced: trials, the Pareto front, the chosen plan, hypervolume.

The chosen plan follows the objective (:mod:`boute.optimize.objectives`): among evaluated plans that meet
the quality floor, the P95 cap and the budget, the lowest P95 (``latency``, the default: ties go to higher
quality, then lower cost), the lowest $/h (``cost``), or the ``--prefer`` pick of the 3-D front
(``pareto``). When none meets them, the closest one is reported (smallest relative violation) and the
caller says so. Trials the screens removed (:attr:`TrialStatus.SCREENED`, :mod:`boute.optimize.screen`) were never
evaluated and count for nothing here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from boute.optimize.evaluators.base import EvalResult
from boute.optimize.objectives import Objective, dominates, nondominated
from boute.optimize.space import Candidate
from boute.optimize.status import TrialStatus
from boute.specs.targets import Targets


@dataclass(frozen=True)
class Trial:
    index: int
    x: tuple[float, ...]  # the point the strategy asked for
    z: tuple[float, ...]  # canonical encoding of the decoded candidate (what the GP trains on)
    candidate: Candidate
    result: EvalResult | None  # None when the evaluation failed
    status: TrialStatus = TrialStatus.COMPLETE
    error: str | None = None
    #: the search step whose batch proposed it (:mod:`boute.optimize.loop`: a resume rebuilds which batch was
    #: in flight from it); None for trials from elsewhere (a warm start, confirmations, rows older than steps)
    step: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == TrialStatus.COMPLETE and self.result is not None

    @property
    def evaluated(self) -> bool:
        """Whether this trial cost an evaluation (screened ones did not; failed ones did)."""
        return self.status != TrialStatus.SCREENED

    def pending(self) -> Trial:
        """This trial as a proposal sees it while its batch is in flight: an evaluation's result unknown
        (:attr:`TrialStatus.PENDING`), a screened one as it is (known without evaluating)."""
        if self.status == TrialStatus.SCREENED:
            return self
        return replace(self, result=None, status=TrialStatus.PENDING, error=None)

    @property
    def checked_result(self) -> EvalResult:
        """The result of a trial known to be ``ok`` (the type checker cannot see that ``ok`` implies one)."""
        if self.result is None:
            raise ValueError(f"trial {self.index} has no result (status {self.status})")
        return self.result


def figures(trials: Sequence[Trial]) -> tuple[list[Trial], np.ndarray, np.ndarray, np.ndarray]:
    """The successful trials (in order) and their quality, P95 and $/h as float arrays: what every choice
    among trials works on."""
    ok = [t for t in trials if t.ok]
    rs = [t.checked_result for t in ok]
    q = np.array([r.quality for r in rs], dtype=float)
    p = np.array([r.p95_latency_s for r in rs], dtype=float)
    c = np.array([r.cost_per_hour for r in rs], dtype=float)
    return ok, q, p, c


def pareto_mask(quality: np.ndarray, p95: np.ndarray) -> np.ndarray:
    """Non-dominated points for (max quality, min P95); exact duplicates are all kept."""
    q = np.asarray(quality, dtype=float)
    p = np.asarray(p95, dtype=float)
    return nondominated(np.stack([-q, p], axis=1)) if q.size else np.zeros(0, dtype=bool)


def pareto_front(
    trials: Sequence[Trial], objective: Objective | None = None, targets: Targets | None = None
) -> list[Trial]:
    """The front the objective keeps: (quality, P95) over all plans for ``latency`` (as before), the 3-D
    (quality, P95, $/h) front of the plans meeting ``targets`` for ``cost`` and ``pareto``."""
    ok, q, p, c = figures(trials)
    if objective is None or objective.name == "latency" or targets is None:
        mask = pareto_mask(q, p)
        front = [t for t, m in zip(ok, mask, strict=True) if m]
        return sorted(front, key=lambda t: (t.checked_result.quality, t.checked_result.p95_latency_s))
    feas = np.flatnonzero(feasible_mask(ok, targets))
    keep = feas[nondominated(np.stack([-q[feas], p[feas], c[feas]], axis=1))] if feas.size else feas
    return sorted(
        (ok[int(i)] for i in keep), key=lambda t: (t.checked_result.cost_per_hour, t.checked_result.p95_latency_s)
    )


def feasible_mask(trials: Sequence[Trial], targets: Targets) -> np.ndarray:
    """Which of the successful trials (in order) meet the targets; sampled qualities within their tolerance."""
    ok = [t.result for t in trials if t.ok and t.result is not None]
    return targets.mask(
        [r.quality for r in ok],
        [r.p95_latency_s for r in ok],
        [r.cost_per_hour for r in ok],
        [r.quality_se for r in ok],
    )


def choose(
    trials: Sequence[Trial], targets: Targets, objective: Objective | None = None
) -> tuple[Trial | None, Trial | None]:
    """``(chosen, closest)``: the objective's answer among plans meeting all targets (or None) and, when
    none does, the closest (smallest violation)."""
    ok, q, p, c = figures(trials)
    if not ok:
        return None, None
    i = (objective or Objective()).pick(q, p, c, feasible_mask(ok, targets), targets)
    if i is not None:
        return ok[i], None
    return None, ok[int(np.argmin(targets.violation(q, p, c)))]


def hypervolume(quality: np.ndarray, p95: np.ndarray, targets: Targets) -> float:
    """2-D hypervolume in (quality, -log P95) above the reference point (floor, -log cap).

    Only plans meeting both targets contribute, so the figure rewards exactly what the operator asked for.
    """
    q = np.asarray(quality, dtype=float)
    y = -np.log(np.maximum(np.asarray(p95, dtype=float), 1e-12))
    ref_q, ref_y = targets.quality_floor, -math.log(targets.p95_cap_s)
    keep = (q >= ref_q) & (y >= ref_y)
    if not keep.any():
        return 0.0
    q, y = q[keep], y[keep]
    order = np.argsort(-q)  # sweep from highest quality down, keeping the best latency seen
    hv, best_y = 0.0, ref_y
    qs, ys = q[order], y[order]
    for i in range(len(qs)):
        best_y = max(best_y, ys[i])
        next_q = qs[i + 1] if i + 1 < len(qs) else ref_q
        hv += (qs[i] - next_q) * (best_y - ref_y)
    return float(hv)


def hypervolume_trace(trials: Sequence[Trial], targets: Targets) -> list[float]:
    """Hypervolume after each evaluation (failed trials repeat the previous value)."""
    out: list[float] = []
    for n in range(1, len(trials) + 1):
        _, q, p, c = figures(trials[:n])
        within = targets.mask(np.full_like(q, np.inf), np.zeros_like(p), c)  # the budget alone
        out.append(hypervolume(q[within], p[within], targets))
    return out


def hypervolume3(quality: np.ndarray, p95: np.ndarray, cost: np.ndarray, targets: Targets) -> float:
    """3-D hypervolume in (quality, -log P95, -$/h) above the reference point (floor, -log cap, -budget).

    BoTorch's exact box decomposition (``Hypervolume``); only plans meeting the targets contribute.
    """
    import torch
    from botorch.utils.multi_objective.hypervolume import Hypervolume
    from botorch.utils.multi_objective.pareto import is_non_dominated

    q, p, c = (np.asarray(v, dtype=float) for v in (quality, p95, cost))
    keep = targets.mask(q, p, c)
    if not keep.any():
        return 0.0
    Y = torch.tensor(np.stack([q[keep], -np.log(np.maximum(p[keep], 1e-12)), -c[keep]], axis=1), dtype=torch.double)
    ref = torch.tensor([targets.quality_floor, -math.log(targets.p95_cap_s), -targets.budget], dtype=torch.double)
    return float(Hypervolume(ref_point=ref).compute(Y[is_non_dominated(Y)]))


class ChoiceTracker:
    """The chosen plan after each evaluation, kept incrementally (the convergence test's history).

    The answer of every objective lies on the 3-D front of the plans meeting the targets, so only that
    front is kept: a new feasible plan either is dominated (the answer cannot change) or joins it.
    """

    def __init__(self, targets: Targets, objective: Objective | None = None) -> None:
        self.targets = targets
        self.objective = objective or Objective()
        self.front: list[Trial] = []
        self.keys: list[str | None] = []

    def add(self, t: Trial) -> None:
        if not t.evaluated:
            return
        r = t.result
        if t.ok and r is not None and self.targets.met_by(r.quality, r.p95_latency_s, r.cost_per_hour, r.quality_se):
            y = np.array([-r.quality, r.p95_latency_s, r.cost_per_hour])
            _, fq, fp, fc = figures(self.front)
            ys = np.stack([-fq, fp, fc], axis=1)  # (0, 3) while the front is empty: nothing dominates
            if not np.any(dominates(ys, y)):
                keep = ~dominates(y, ys)
                self.front = [u for u, k in zip(self.front, keep, strict=True) if k] + [t]
        if not self.front:
            self.keys.append(None)
            return
        _, q, p, c = figures(self.front)
        i = self.objective.pick(q, p, c, np.ones(len(q), dtype=bool), self.targets)
        self.keys.append(None if i is None else self.front[i].candidate.key())


def best_key_trace(trials: Sequence[Trial], targets: Targets, objective: Objective | None = None) -> list[str | None]:
    """Key of the chosen plan after each evaluation (screened trials are not evaluations): convergence =
    unchanged for ``patience`` steps."""
    tr = ChoiceTracker(targets, objective)
    for t in trials:
        tr.add(t)
    return tr.keys
