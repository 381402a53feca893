"""The tracking DB's rows of a search: a trial as a row and back, a front point.

One format in both directions (:func:`trial_row` / :func:`trial_from_row`): ``params`` holds the point the
strategy asked for (``x``), its canonical encoding (``z``), the decoded plan and the search step that proposed
it (``step``, absent in rows written before steps were recorded), ``metrics`` the
:meth:`~boute.optimize.evaluators.base.EvalResult.to_dict` of its result. A resumed search reads its trials
back from these rows, so a row written by one version must read in the next.
"""

from __future__ import annotations

from typing import Any

from boute.optimize.evaluators.base import EvalResult
from boute.optimize.space import Candidate
from boute.optimize.status import TrialStatus
from boute.optimize.trial_store import StoredTrial
from boute.optimize.trials import Trial
from boute.specs import ReplicaGroup


def trial_row(t: Trial) -> dict[str, Any]:
    c = t.candidate
    return {
        "index": t.index,
        "status": TrialStatus(t.status).value,
        "evaluator": t.result.evaluator if t.result else ("screen" if t.status == TrialStatus.SCREENED else ""),
        "params": {
            "x": list(t.x),
            "z": list(t.z),
            "fractions": list(c.fractions),
            "deployment": [g.model_dump(mode="json") for g in c.deployment],
            "cost_per_hour": c.cost_per_hour,
            **({"step": t.step} if t.step is not None else {}),
        },
        "metrics": t.result.to_dict() if t.result else None,
        "error": t.error,
        "wall_s": t.result.wall_s if t.result else 0.0,
    }


def trial_from_row(row: StoredTrial) -> Trial:
    p = row.params
    cand = Candidate(
        tuple(p["fractions"]), tuple(ReplicaGroup(**g) for g in p["deployment"]), float(p["cost_per_hour"])
    )
    res = EvalResult.from_dict(row.metrics) if row.metrics else None
    step = p.get("step")
    return Trial(
        row.index,
        tuple(p["x"]),
        tuple(p["z"]),
        cand,
        res,
        status=TrialStatus(row.status),
        error=row.error,
        step=None if step is None else int(step),
    )


def front_point(t: Trial) -> dict[str, Any]:
    r = t.result
    assert r is not None
    return {
        "trial": t.index,
        "quality": r.quality,
        "p95_latency_s": r.p95_latency_s,
        "throughput_rps": r.throughput_rps,
        "cost_per_hour": r.cost_per_hour,
        "fractions": list(t.candidate.fractions),
        "deployment": [g.model_dump(mode="json") for g in t.candidate.deployment],
    }
