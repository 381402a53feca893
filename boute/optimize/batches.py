"""One search step's batch on its way from proposals to trials: screened, handed to the pool, collected.

A batch's trials are numbered ``start, start + 1, ...`` in the order proposed, screened ones in their place
among the evaluated ones, and carry the step that proposed them (``Trial.step``). With a
:class:`~boute.optimize.screen.Screen` a proposal's routing is first moved into the region where the exact
quality model meets the floor, and a plan that cannot carry its load is a screened trial, never evaluated.
A plan evaluated before is answered from the search's cache (no wall time, marked ``cached``), and a plan
asked twice in one batch is evaluated once.

While a batch is evaluated the next one is proposed with it *pending* (:meth:`Batch.pending`): its screened
trials as they are, the others with their results unknown (:attr:`TrialStatus.PENDING`). A resumed search
rebuilds the same view of its last stored batch (:meth:`Batch.stored`), so the proposal after a resume is the
one the interrupted search would have made.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from boute.errors import BouteError
from boute.optimize.clock import SearchClock
from boute.optimize.evaluators.base import EvalResult
from boute.optimize.evaluators.pool import EvaluatorPool, Submitted
from boute.optimize.screen import Screen
from boute.optimize.space import Candidate, Space
from boute.optimize.status import TrialStatus
from boute.optimize.trials import Trial


def _cached(hit: EvalResult) -> EvalResult:
    """``hit`` as the answer to a repeat of its plan: no wall time, marked ``cached``."""
    return replace(hit, wall_s=0.0, extra=replace(hit.extra, cached=True))


@dataclass
class Batch:
    """Trials ``start ..`` of step ``step``: ``slots`` holds each screened trial, None where an evaluation goes
    (of the next of ``plans``); ``pending`` is the whole batch as the next proposal sees it. ``submitted``: its
    evaluations out with the pool (None before and once collected)."""

    step: int
    start: int
    slots: list[Trial | None]
    plans: list[Candidate]  # the plan of each evaluation, in order
    pending: list[Trial]
    submitted: Submitted | None = None
    handed_at: float = 0.0  # time.monotonic() when the pool took it (its evaluation then runs on its own)
    ready_at: float | None = None  # time.monotonic() when its last result came in, once collected
    recorded: bool = False
    _fresh: dict[int, int] = field(default_factory=dict)  # evaluation -> its place among those sent to the pool
    _repeat: dict[int, int] = field(default_factory=dict)  # a repeat in this batch -> the evaluation it repeats
    _known: dict[int, EvalResult] = field(default_factory=dict)  # evaluation -> the cached answer it gets

    @property
    def evaluations(self) -> int:
        """Trials of this batch that cost an evaluation (cached answers count, as in ``max_evals``)."""
        return len(self.plans)

    @classmethod
    def screened(
        cls, space: Space, screen: Screen | None, xs: Sequence[np.ndarray], step: int, start: int, clock: SearchClock
    ) -> Batch:
        """The proposals ``xs`` through the screens (module doc), as trials ``start, start + 1, ...``."""
        slots: list[Trial | None] = []
        plans: list[Candidate] = []
        pending: list[Trial] = []
        for j, x in enumerate(xs):
            why: str | None = None
            if screen is not None:
                with clock.timing("screen"):
                    _, cand, why = screen.admit(x)  # (the plan of the projected point)
            else:
                cand = space.decode(x)
            asked = tuple(float(v) for v in np.clip(x, 0, 1))  # the point the strategy asked for
            z = tuple(float(v) for v in space.encode(cand))
            if why is None:
                plans.append(cand)
                slots.append(None)
                pending.append(Trial(start + j, asked, z, cand, None, TrialStatus.PENDING, step=step))
            else:
                t = Trial(start + j, asked, z, cand, None, TrialStatus.SCREENED, why, step=step)
                slots.append(t)
                pending.append(t)
        return cls(step, start, slots, plans, pending)

    @classmethod
    def stored(cls, trials: Sequence[Trial]) -> Batch | None:
        """The last step's batch among stored trials (those with the largest ``step``), recorded already: what
        was pending when the search that stored them proposed its next batch. None without steps."""
        steps = [t.step for t in trials if t.step is not None]
        if not steps:
            return None
        last = max(steps)
        mine = [t for t in trials if t.step == last]
        start = mine[0].index
        if [t.index for t in mine] != list(range(start, start + len(mine))) or start + len(mine) != len(trials):
            return None  # not the tail of the trials: nothing to rebuild
        return cls(last, start, [], [], [t.pending() for t in mine], recorded=True)

    def submit(self, pool: EvaluatorPool, cache: dict[str, EvalResult]) -> None:
        """Hand the plans not evaluated before to ``pool`` (each once) and return without waiting."""
        firsts: dict[str, int] = {}
        fresh: list[Candidate] = []
        for i, cand in enumerate(self.plans):
            key = cand.key()
            if key in cache:
                self._known[i] = cache[key]
            elif key in firsts:
                self._repeat[i] = firsts[key]
            else:
                firsts[key] = i
                self._fresh[i] = len(fresh)
                fresh.append(cand)
        self.handed_at = time.monotonic()
        self.submitted = pool.submit(fresh)
        # answered while being handed over (evaluated in this process): nothing of it runs on after
        self.handed_at = time.monotonic() if self.submitted.ready_at is not None else self.handed_at

    def collect(self, cache: dict[str, EvalResult]) -> list[Trial]:
        """Wait for the evaluations and return the batch's trials in order; fresh results join ``cache``."""
        assert self.submitted is not None
        fresh = self.submitted.results()
        self.ready_at = self.submitted.ready_at
        self.submitted = None
        results: list[EvalResult | BouteError] = []
        for i, cand in enumerate(self.plans):
            if i in self._fresh:
                res = fresh[self._fresh[i]]
                if isinstance(res, EvalResult):
                    cache[cand.key()] = res
            elif i in self._repeat:  # a repeat, in this batch, of a plan evaluated in it
                first = fresh[self._fresh[self._repeat[i]]]
                res = _cached(first) if isinstance(first, EvalResult) else first
            else:
                res = _cached(self._known[i])
            results.append(res)
        answers = iter(results)
        out: list[Trial] = []
        for view, slot in zip(self.pending, self.slots, strict=True):
            if slot is not None:
                out.append(slot)
                continue
            res = next(answers)
            if isinstance(res, BouteError):
                out.append(replace(view, status=TrialStatus.FAILED, error=str(res)))
            else:
                out.append(replace(view, result=res, status=TrialStatus.COMPLETE))
        return out

    def tail_s(self) -> float:
        """Seconds its evaluation went on after the pool took it (0: evaluated while being handed over), once
        collected: what a search that stops after handing it over still waits for (:mod:`boute.optimize.pace`)."""
        return 0.0 if self.ready_at is None else max(0.0, self.ready_at - self.handed_at)
