"""Where a plan's wall time goes: seconds by phase, for the progress bar, the run's summary and the tracking DB.

Why: a search is bounded by its slowest part, and which part that is depends on the scenario and the machine.
On a quiet 2-core machine the simulator is cheap and MOBO's own step (its GP fit, the candidate pool, the
acquisition) bounds it; on a fleet of 480 GPUs each simulation takes seconds and the pool of workers does.
Without the split a user sees only that a search is slow; with it they see whether ``--workers``,
``--batch``, ``--time-budget`` or the strategy is the lever.

The phases of one plan, in order (top level, their sum plus ``other`` is the plan's wall time):

* ``prepare``: the search evaluator and what it is built from: the scenario's quality model (its routers
  and, for a cascade, its judge's scores) and request stream. On a fresh cache this is where the first-use
  builds go, each a sub-phase (``prepare.static``: distilling the static embedding table, ``prepare.router``,
  ``prepare.verifier``, ``prepare.tokens``, ``prepare.embed``; :mod:`boute.data.builds`); on a warm one it
  only loads them (``make install`` builds them ahead: :mod:`boute.optimize.prepare`);
* ``setup``: the space, the screens, the worker pool's start, resuming from the tracking DB;
* ``propose``: the strategy's ``ask_batch``; a model-based strategy splits it into sub-phases
  (``propose.fit``, ``propose.pool``, ``propose.acquisition``);
* ``screen``: the quality projection and capacity bound on each proposal;
* ``evaluate``: the batch's evaluations by the worker pool, waiting on its slowest worker included;
* ``record``: each trial into the tracking DB and the caller's callback (the progress bar);
* ``confirm``: the more faithful evaluator's re-checks and its continued search.

With proposing and evaluating overlapped (:mod:`boute.optimize.loop`), ``evaluate`` is the time the search
*waited* for a batch; what the workers evaluated while the strategy proposed is kept apart, per phase, as
:attr:`SearchClock.beside` (shown as ``+N s beside``): it ran, but on no one's wall.

Milestones (:attr:`SearchClock.marks`): the seconds since the clock started (the run's start) and the
evaluations made when something first happened; ``first_feasible``: the first evaluated plan meeting every
target, the time a user waits for a plan they could deploy.

The clock is a meter at the edge, written by the loop and read by whoever shows it; nothing a search
decides depends on it, so proposals stay a pure function of the trials (resuming stays exact).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

#: the top-level phases in the order a plan goes through them (module doc)
PHASES = ("prepare", "setup", "propose", "screen", "evaluate", "record", "confirm")


@dataclass(frozen=True)
class Milestone:
    """When something first happened in a run: seconds since the clock started, evaluations made by then."""

    seconds: float
    evaluations: int

    def to_json(self) -> dict[str, float | int]:
        return {"s": round(self.seconds, 3), "evaluations": self.evaluations}


@dataclass
class SearchClock:
    """Seconds spent per phase (``"propose"``) and sub-phase (``"propose.fit"``), summed over the run; seconds
    a phase ran beside another (:attr:`beside`); milestones (:attr:`marks`) since ``started``; and the run's
    elapsed wall time (:meth:`elapsed`: what each trial is recorded with, ``trials.elapsed_s``).

    ``started``: when the run began (``time.perf_counter``); ``resumed_s``: the wall time earlier runs of a
    resumed experiment took (its stored trials' last ``elapsed_s``), so a resumed experiment's trials keep
    counting from where it stopped, the time between the runs left out."""

    seconds: dict[str, float] = field(default_factory=dict)
    beside: dict[str, float] = field(default_factory=dict)
    marks: dict[str, Milestone] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    resumed_s: float = 0.0

    def elapsed(self) -> float:
        """Seconds of the experiment's runs so far: ``resumed_s`` plus this run's since ``started``."""
        return self.resumed_s + time.perf_counter() - self.started

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, float(seconds))

    def add_beside(self, phase: str, seconds: float) -> None:
        """``seconds`` of ``phase`` that ran while the search did something else (not on the wall)."""
        self.beside[phase] = self.beside.get(phase, 0.0) + max(0.0, float(seconds))

    def mark(self, name: str, evaluations: int) -> None:
        """Milestone ``name`` now, after ``evaluations`` (only its first time counts)."""
        self.marks.setdefault(name, Milestone(time.perf_counter() - self.started, evaluations))

    @contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        """Time the block as ``phase`` (added when it ends, however it ends)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - t0)

    def beside_snapshot(self) -> dict[str, float]:
        """:attr:`beside`, rounded to ms (recorded with the experiment as ``beside_s``)."""
        return {k: round(v, 3) for k, v in self.beside.items()}

    def snapshot(self) -> dict[str, float]:
        """The seconds so far, rounded to ms, phases in :data:`PHASES` order (then any other), each phase's
        sub-phases in the order they were first timed."""
        return {k: round(v, 3) for k, v in sorted(self.seconds.items(), key=lambda kv: _order(kv[0]))}


def _order(name: str) -> int:
    top = name.split(".", 1)[0]
    return PHASES.index(top) if top in PHASES else len(PHASES)  # (sorted() is stable: ties keep their order)


def top_level(seconds: Mapping[str, float]) -> dict[str, float]:
    """The phases of ``seconds`` without their sub-phases (``"propose"``, not ``"propose.fit"``), in
    :data:`PHASES` order: disjoint, so they add up to the time the clock saw."""
    return {k: seconds[k] for k in sorted((k for k in seconds if "." not in k), key=_order)}


def breakdown(
    seconds: Mapping[str, float],
    *,
    wall_s: float | None = None,
    detail: bool = True,
    beside: Mapping[str, float] | None = None,
) -> str:
    """``seconds`` as one line: ``"setup 1.2 s, propose 12.1 s (fit 4.0, pool 5.1, acquisition 2.8), ..."``.

    Phases in :data:`PHASES` order, zero phases left out; ``detail``: each phase's sub-phases in brackets;
    ``beside``: each phase's seconds run beside others (``evaluate 1.0 s (+4.2 s beside)``); ``wall_s``: the
    run's wall time, whose part outside every phase (writing the plan, imports) is shown as ``other``."""
    tops = top_level(seconds)
    parts: list[str] = []
    for top in tops:
        extra = (beside or {}).get(top, 0.0)
        if tops[top] < 0.05 and extra < 0.05:
            continue
        subs = [f"{k.split('.', 1)[1]} {v:.1f}" for k, v in seconds.items() if k.startswith(top + ".") and v >= 0.05]
        subs = (subs if detail else []) + ([f"+{extra:.1f} s beside"] if extra >= 0.05 else [])
        inner = f" ({', '.join(subs)})" if subs else ""
        parts.append(f"{top} {tops[top]:.1f} s{inner}")
    if wall_s is not None:
        rest = wall_s - sum(tops.values())
        if rest >= 0.05:
            parts.append(f"other {rest:.1f} s")
    return ", ".join(parts) if parts else "nothing timed yet"
