"""What a search produced, as the session, the confirmation and the plan writer see it: :class:`Outcome`.

Its own module so that :mod:`boute.optimize.session` (which builds one) and :mod:`boute.optimize.confirm`
(which completes it) both import it and neither imports the other's caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import EvalResult
from boute.optimize.objectives import Objective
from boute.optimize.space import Space
from boute.optimize.trials import Trial


@dataclass
class Outcome:
    """A search's trials and what was chosen from them; confirmation fills ``confirmed``, ``confirmations``
    and ``final`` (the plan to write: the search's ``chosen``, or the confirmation's pick, or None)."""

    space: Space
    trials: list[Trial]
    chosen: Trial | None
    closest: Trial | None
    front: list[Trial]
    hypervolume: float
    resumed_trials: int = 0
    experiment_id: int | None = None
    experiment_name: str | None = None
    confirmed: dict[int, EvalResult] = field(default_factory=dict)  # trial index -> confirming result
    confirmations: list[Trial] = field(default_factory=list)  # the confirming evaluations, as trials
    final: Trial | None = None  # the plan written: chosen, or the confirmation's pick (None: none confirmed)
    objective: Objective = field(default_factory=Objective)
    screen: dict[str, dict[str, int]] | None = None  # ScreenCounts of the search's proposals and MOBO's pool
    confirm_closest: Trial | None = None  # when no confirmed plan meets the targets: the closest confirmed
    clock: SearchClock = field(default_factory=SearchClock)  # where the time went, by phase (search + confirm)

    @property
    def evaluations(self) -> int:
        """Trials that cost an evaluation (screened ones did not)."""
        return sum(t.evaluated for t in self.trials)

    @property
    def screened(self) -> int:
        return len(self.trials) - self.evaluations

    def infeasible_message(self) -> str:
        tg = self.space.scenario.goal
        head = (
            f"no plan meets quality >= {tg.quality_floor:g} and P95 <= {tg.p95_cap_s:g} s within "
            f"${tg.budget:g}/h after {self.evaluations} evaluations"
        )
        if self.closest is None or self.closest.result is None:
            return head
        r = self.closest.result
        return (
            f"{head}; closest: quality {r.quality:.4f}, P95 {r.p95_latency_s:.3g} s, ${r.cost_per_hour:.2f}/h "
            f"(trial {self.closest.index}); relax --quality-floor/--p95-cap or raise --budget"
        )

    def unconfirmed_message(self) -> str:
        """Why nothing is written when the confirming evaluator rejects every plan it checked."""
        tg = self.space.scenario.goal
        n = sum(t.result is not None for t in self.confirmations)
        ev = next((t.result.evaluator for t in self.confirmations if t.result is not None), "the confirmation")
        head = (
            f"no plan meets quality >= {tg.quality_floor:g} and P95 <= {tg.p95_cap_s:g} s within "
            f"${tg.budget:g}/h by {ev}: {n} plans confirmed after {self.evaluations} searched"
        )
        t = self.confirm_closest
        if t is None:
            return f"{head}; no plan could be confirmed; retry with more --max-confirm or --no-confirm"
        r = self.confirmed[t.index]
        s = t.result
        fast = f" ({s.evaluator}: P95 {s.p95_latency_s:.3g} s)" if s is not None and s.evaluator != r.evaluator else ""
        return (
            f"{head}; closest: quality {r.quality:.4f}, P95 {r.p95_latency_s:.3g} s{fast}, "
            f"${r.cost_per_hour:.2f}/h (trial {t.index}); raise --max-confirm, relax the targets or raise --budget"
        )
