"""What a search produced, as the session, the confirmation and the plan writer see it: :class:`Outcome`.

Its own module so that :mod:`boute.optimize.session` (which builds one) and :mod:`boute.optimize.confirm`
(which completes it) both import it and neither imports the other's caller. An outcome is a value: the
confirmation returns a new one with its results (:meth:`Outcome.confirmed_as`), it never changes one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import EvalResult
from boute.optimize.objectives import Objective
from boute.optimize.screen import ScreenReport
from boute.optimize.space import Space
from boute.optimize.trials import Trial


@dataclass(frozen=True)
class Outcome:
    """A search's trials and what was chosen from them; a confirmation's outcome adds ``confirmed``,
    ``confirmations`` and ``final`` (the plan to write: the search's ``chosen``, or the confirmation's pick,
    or None)."""

    space: Space
    trials: list[Trial]
    chosen: Trial | None
    closest: Trial | None
    front: list[Trial]
    hypervolume: float
    resumed_trials: int = 0
    experiment_id: int | None = None
    experiment_name: str | None = None
    confirmed: Mapping[int, EvalResult] = field(default_factory=dict)  # trial index -> confirming result
    confirmations: Sequence[Trial] = ()  # the confirming evaluations, as trials
    final: Trial | None = None  # the plan written: chosen, or the confirmation's pick (None: none confirmed)
    objective: Objective = field(default_factory=Objective)
    screen: ScreenReport | None = None  # what the screens did to the search's proposals and MOBO's pool
    confirm_closest: Trial | None = None  # when no confirmed plan meets the targets: the closest confirmed
    clock: SearchClock = field(default_factory=SearchClock)  # where the time went, by phase (search + confirm)

    @property
    def evaluations(self) -> int:
        """Trials that cost an evaluation (screened ones did not)."""
        return sum(t.evaluated for t in self.trials)

    @property
    def screened(self) -> int:
        return len(self.trials) - self.evaluations

    def confirmed_as(
        self,
        confirmed: Mapping[int, EvalResult],
        confirmations: Sequence[Trial],
        final: Trial | None,
        closest: Trial | None = None,
    ) -> Outcome:
        """This outcome completed by a confirmation: its results by search trial index, its evaluations as
        trials, the plan to write (None: none confirmed) and, then, the closest confirmed plan."""
        return replace(
            self, confirmed=dict(confirmed), confirmations=tuple(confirmations), final=final, confirm_closest=closest
        )

    def confirmed_by_search(self) -> Outcome:
        """This outcome with the search's own answer as its confirmation: the search's evaluator is already
        the most faithful one asked for."""
        t = self.chosen
        if t is None or t.result is None:
            return self
        return replace(self, confirmed={**self.confirmed, t.index: t.result})

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
