"""What the search loop asks of a strategy (:func:`boute.optimize.loop.run_search`).

A strategy proposes points of the unit box from the trials so far, as a function of them for a given
seed (a resumed run hands back the stored trials and the next proposals follow from them). The trials a
strategy is handed end with the batch in flight, if any (:mod:`boute.optimize.loop`): its evaluations as
:attr:`~boute.optimize.status.TrialStatus.PENDING` trials (the plan known, the result not), its screened
proposals as they are; trial ``len(trials)`` is still the next one. A strategy must not propose those
plans again and must not read a pending trial as a failure; one that cannot propose before their results
(NSGA-II closing a generation) returns no points, and the loop asks again once they are in. Everything the loop calls is defined here, with defaults, so the loop
calls it on every strategy instead of probing for it:

* :meth:`Strategy.ask`: the next point (required).
* :meth:`Strategy.ask_batch`: ``q`` proposals at once, which the loop evaluates together (in parallel where
  it has a pool of evaluator processes). Model-based strategies fit once per batch; the default is one
  proposal.
* :meth:`Strategy.bind`: the evaluator the search runs with (MOBO takes its exact quality model).
* :meth:`Strategy.use_screen`: the screens the loop applies (MOBO screens its acquisition pool too).
* :meth:`Strategy.use_clock`: the search's clock (:mod:`boute.optimize.clock`); a strategy with parts worth
  timing (MOBO: fit, pool, acquisition) adds them as sub-phases of ``propose``.
* :attr:`Strategy.n_init`: the initial design's size; the convergence test never stops a search inside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from boute.optimize.clock import SearchClock
    from boute.optimize.evaluators.base import Evaluator
    from boute.optimize.screen import Screen
    from boute.optimize.surrogates.prior import SoonMany
    from boute.optimize.trials import Trial


class Strategy:
    """Base of every search strategy: ``ask`` is required, the rest default to doing nothing special."""

    name = "strategy"
    #: evaluations of the initial design before the strategy's model takes over (0: no design phase)
    n_init: int = 0

    def ask(self, trials: Sequence[Trial]) -> np.ndarray:
        """The point for trial ``len(trials)``."""
        raise NotImplementedError

    def ask_batch(self, trials: Sequence[Trial], q: int) -> list[np.ndarray]:
        """Up to ``q`` points for trials ``len(trials), len(trials) + 1, ...`` (at least one)."""
        return [self.ask(trials)]

    def bind(self, evaluator: Evaluator) -> None:
        """The evaluator this search runs with (called once by the loop before the first ask)."""

    def use_screen(self, screen: Screen) -> None:
        """The screens the loop applies to every proposal (called once, when it screens)."""

    def use_clock(self, clock: SearchClock) -> None:
        """The search's clock, to add this strategy's sub-phases of ``propose`` to (called once by the loop)."""

    def use_prior_many(self, p95_soon: SoonMany) -> None:
        """A function starting the prior's P95 of many plans at once, by processes that would otherwise wait
        (called by the search when its evaluation pool has idle workers while proposals are made); it returns
        the function that waits for them."""
