"""Where :class:`~boute.optimize.strategies.mobo.MoboStrategy` searches next: its centres and its spent deployments.

The acquisition scores a pool of plans built around a few evaluated plans, the *centres*
(:func:`boute.optimize.acquisition.pool.build_pool`). Which plans those are decides what the acquisition can
ever see, so the choice is made here, once, from the trials' figures alone: every function is pure, takes
the evaluated plans' quality ``q``, P95 ``p`` (s) and cost ``c`` ($/h) as arrays in trial order, and returns
indices into them (or deployment keys), never plans.

* :func:`floor_incumbents`: the ``latency`` search (and any search before a plan meets every target).
* :func:`front_incumbents`: the ``cost`` and ``pareto`` searches once some plan meets the targets.
* :func:`near_miss`: one more centre for those two, the cheaper plan that misses the targets least.
* :func:`spent_deployments`: deployments the ``cost`` search keeps out of the pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from boute.optimize.objectives import Objective, nondominated
from boute.optimize.trials import pareto_mask
from boute.specs.targets import Targets, meets_floor

#: the ``cost`` search's routings per deployment before it counts as spent (:func:`spent_deployments`)
ROUTINGS_PER_DEPLOYMENT = 12
#: how many incumbents each rule returns (before :func:`near_miss` adds its one)
N_CENTRES = 3


def floor_incumbents(q: np.ndarray, p: np.ndarray, floor: float, *, front: bool = False) -> list[int]:
    """The lowest-P95 plans meeting the quality floor; with ``front`` (an EHVI step) or when none meets it,
    also the lowest-P95 plans of the (quality, P95) front that meet it; when still none, the highest-quality
    plans, so that the first steps climb towards the floor."""
    meets = meets_floor(q, floor)
    above = np.flatnonzero(meets)
    idx = [int(i) for i in above[np.argsort(p[above])][:N_CENTRES]]
    if front or not idx:
        on_front = np.flatnonzero(pareto_mask(q, p) & meets)
        idx += [int(i) for i in on_front[np.argsort(p[on_front])][:N_CENTRES] if int(i) not in idx]
    if not idx:
        idx = [int(i) for i in np.argsort(-q)[:N_CENTRES]]
    return idx


def front_incumbents(
    q: np.ndarray, p: np.ndarray, c: np.ndarray, feas: np.ndarray, goal: Targets, objective: Objective
) -> list[int]:
    """Incumbents for ``cost``/``pareto``: the objective's two best plans on the feasible 3-D front
    (:meth:`Objective.order`) and the cheapest feasible plan; topped up to :data:`N_CENTRES` with the plans
    of least :meth:`Targets.violation` (ties to the cheaper), which before any plan meets the targets are
    the only centres."""
    idx: list[int] = []
    f = np.flatnonzero(feas)
    if f.size:
        front = f[nondominated(np.stack([-q[f], p[f], c[f]], axis=1))]
        idx = [int(front[j]) for j in objective.order(q[front], p[front], c[front], goal)[:2]]
        cheapest = int(f[np.argmin(c[f])])
        if cheapest not in idx:
            idx.append(cheapest)
    for j in np.argsort(goal.violation(q, p, c) + 1e-9 * c):
        if len(idx) >= N_CENTRES:
            break
        if int(j) not in idx:
            idx.append(int(j))
    return idx


def spent_deployments(deps: Sequence[str], feas: np.ndarray, limit: int = ROUTINGS_PER_DEPLOYMENT) -> set[str]:
    """Deployments the ``cost`` search has nothing left to learn from: each kept out of the pool.

    ``deps``: each evaluated plan's :meth:`~boute.optimize.space.Candidate.deployment_key`. A plan's $/h is
    its deployment's, so another routing of a deployment can lower the cost only by turning it feasible.
    Spent: a deployment with a feasible plan (no cheaper routing of it exists), or one evaluated at
    ``limit`` routings, none feasible. Why the limit: the simulator's P95 is a step function of the routing
    (which requests cross the difficulty threshold), so near the cap the GP reads the steps as noise around
    a mean just above the cap and scores every new routing of the deployment as a fair chance; long-prompt's
    search at $13.20/h spent 166 of its ~700 evaluations on one $12.64/h deployment whose best P95 was
    5.02 s against the 5 s cap.
    """
    tried: dict[str, int] = {}
    done: set[str] = set()
    for dep, f in zip(deps, feas, strict=True):
        tried[dep] = tried.get(dep, 0) + 1
        if f:
            done.add(dep)
    return done | {d for d, n in tried.items() if n >= limit}


def near_miss(
    deps: Sequence[str],
    q: np.ndarray,
    p: np.ndarray,
    c: np.ndarray,
    feas: np.ndarray,
    spent: set[str],
    goal: Targets,
    clip_s: float,
) -> int | None:
    """The plan cheaper than every feasible one that comes closest to meeting the targets, or ``None``.

    Why a centre of its own: when the cheapest feasible plan sits in a basin, the cheaper plans that do
    meet the targets are often two or three changes away (long-prompt at $13.20/h: the large tier
    re-sharded 2 x TP2 over H100 and RTX PRO 6000 GPUs *and* a small-tier replica added *and* more load
    routed to it, $12.19/h). Each single change from the incumbent either costs more or misses the cap, so
    the moves around the incumbent never reach it; the evaluated plan that already made the first change
    and misses least (there: P95 5.98 s against the 5 s cap, $11.60/h) is one change away.

    Candidates: plans meeting the quality floor, not feasible, cheaper than the cheapest feasible plan, with
    P95 below ``clip_s`` (the GP's clip: beyond it the model sees nothing), whose deployment is not
    ``spent`` (:func:`spent_deployments`, so the centre moves on to the next near miss). The one with the
    least :meth:`Targets.violation` wins, ties to the cheaper. Needs a feasible plan (``feas.any()``).
    """
    cheapest = float(c[feas].min())
    fresh = np.array([d not in spent for d in deps], dtype=bool)
    cand = np.flatnonzero(meets_floor(q, goal.quality_floor) & (c < cheapest - 1e-9) & (p < clip_s) & ~feas & fresh)
    if cand.size == 0:
        return None
    v = goal.violation(q[cand], p[cand], c[cand])
    return int(cand[np.lexsort((c[cand], v))[0]])
