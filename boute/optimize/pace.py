"""The time budget (``--time-budget``): whether the search's next step still ends before its deadline.

Why a forecast: a step is indivisible once started (its batch is handed to the pool and its results are
waited for), so a loop that only checks the clock between steps overruns its budget by up to a whole step:
on the 480-GPU fleet one step is seconds of simulation and one overran a 30 s budget by 5 s.

What a step commits the search to. One turn of the loop (:mod:`boute.optimize.loop`) proposes batch k+1 while
batch k is evaluated, waits for and records batch k, and hands batch k+1 to the pool: it takes ``W`` seconds.
The search can then stop at the next turn, but must still wait for batch k+1: ``E`` more seconds, the
evaluation left after the hand-over (0 when the batch is evaluated in this process during the hand-over,
where it is part of ``W``). So starting a step at ``now`` ends the search no earlier than ``now + W + E``,
and a step starts only if

    now + max(W over the last WINDOW steps) + max(E over the last WINDOW batches) <= deadline.

The maxima make the forecast cautious where durations vary (the model's fit and the pool grow with the
trials; simulations differ by plan). Approximate: a step much slower than the ones before it (the first
model step after the initial design, say) still overruns by the difference, once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: how many recent steps (and batches) the forecast takes its maxima over
WINDOW = 3


@dataclass
class Pace:
    """The recent steps' durations and the decisions taken on them (:meth:`fits`); a meter, like the clock:
    what it says changes only where the search stops, never what it proposes."""

    walls: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))  # W of the last steps
    tails: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))  # E of the last batches
    #: every decision: (now, forecast end, started?)
    decisions: list[tuple[float, float, bool]] = field(default_factory=list)

    def step_took(self, seconds: float) -> None:
        self.walls.append(max(0.0, seconds))

    def tail_took(self, seconds: float) -> None:
        self.tails.append(max(0.0, seconds))

    def forecast(self, now: float) -> float:
        """When the search ends at the earliest if it starts a step at ``now`` (module doc)."""
        return now + max(self.walls, default=0.0) + max(self.tails, default=0.0)

    def fits(self, now: float, deadline: float | None) -> bool:
        """Whether a step started at ``now`` ends by ``deadline`` (always, without one), as forecast."""
        if deadline is None:
            return True
        end = self.forecast(now)
        ok = end <= deadline
        self.decisions.append((now, end, ok))
        return ok
