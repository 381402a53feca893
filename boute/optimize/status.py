"""The statuses the tracking DB records: a trial's (:class:`TrialStatus`) and an experiment's
(:class:`ExperimentStatus`).

They are string enums whose values are the strings every earlier version stored, so a row of an old DB
reads back as the same member and a row written now reads in an old version.
"""

from __future__ import annotations

from enum import StrEnum


class TrialStatus(StrEnum):
    COMPLETE = "complete"  # evaluated, with a result
    FAILED = "failed"  # evaluated, and the evaluation failed (it cost an evaluation)
    SCREENED = "screened"  # removed by the screens before any evaluation (boute.optimize.screen)
    CONFIRMED = "confirmed"  # a confirming re-evaluation of a search trial (boute.optimize.confirm)
    CONFIRM_SEARCH = "confirm-search"  # a trial of the search continued with the confirming evaluator
    #: proposed and not evaluated yet: how the next batch's proposal sees the batch in flight
    #: (:mod:`boute.optimize.loop`); never recorded
    PENDING = "pending"


#: the statuses of confirming evaluations, not the search's own trials
CONFIRMING = frozenset({TrialStatus.CONFIRMED, TrialStatus.CONFIRM_SEARCH})


class ExperimentStatus(StrEnum):
    RUNNING = "running"
    COMPLETE = "complete"  # the search chose a plan meeting the targets
    INFEASIBLE = "infeasible"  # no evaluated plan met the targets
    UNCONFIRMED = "unconfirmed"  # the confirming evaluator rejected every plan it checked
