"""Rolling updates: a pure planner (current set, desired set -> ordered steps) and a small executor.

The guarantee the planner gives, and :func:`registered_trace` lets tests check: a replica is registered
with the gateway only after it answered its health check, and an old replica is deregistered only while
another registered replica of its tier remains -- or, for a tier the new plan drops, after the new plan
(which sends that tier no load) was published. So the gateway never sees a loaded tier with zero
replicas. Old replicas are drained (no requests in flight) before they are stopped.

Surge is one replica per swap: each new replica is started and ready before the old one it replaces goes
(make before break). Given the cluster's ``capacity`` (GPUs per type), the planner first runs the swaps
and additions that fit; when none fits (a GPU type the old plan uses to the last card), it takes an old
replica out *before* starting its successor (break before make), but only while another registered
replica keeps its tier serving; and it retires replicas the new plan drops early under the same rule.
Without ``capacity`` every step is assumed to fit (make before break throughout).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from backends.deploy.desired import ReplicaKey

Action = Literal["start", "ready", "register", "publish_plan", "deregister", "drain", "stop"]
ADD: tuple[Action, ...] = ("start", "ready", "register")
REMOVE: tuple[Action, ...] = ("deregister", "drain", "stop")


@dataclass(frozen=True)
class Step:
    action: Action
    replica: ReplicaKey | None = None  # None only for publish_plan

    def __str__(self) -> str:
        return f"{self.action} {self.replica.id}" if self.replica else self.action


def _pair(adds: list[ReplicaKey], removes: list[ReplicaKey]) -> tuple[list[tuple[ReplicaKey, ReplicaKey]], list, list]:
    """Pair each removal with an addition in the same tier, same GPU type first (frees what the new one used)."""
    adds, removes = list(adds), list(removes)
    pairs: list[tuple[ReplicaKey, ReplicaKey]] = []
    for same_gpu in (True, False):
        for old in list(removes):
            match = next((a for a in adds if a.tier == old.tier and (a.gpu == old.gpu or not same_gpu)), None)
            if match is not None:
                pairs.append((match, old))
                adds.remove(match)
                removes.remove(old)
    return pairs, adds, removes


def plan_rollout(
    current: Iterable[ReplicaKey], desired: Iterable[ReplicaKey], capacity: Mapping[str, int] | None = None
) -> list[Step]:
    """Ordered steps from ``current`` to ``desired``; replicas in both are left alone.

    Order: extra replicas first (capacity before swaps; started in parallel), then swaps (new ready -> old
    out, one at a time), then the new plan is published, then replicas without a successor go. With
    ``capacity`` (GPUs per type), steps that do not fit wait until earlier steps free GPUs (see the module
    docstring); if nothing can free them, the remaining steps are emitted anyway and the target reports
    the missing capacity when it cannot place a replica.
    """
    cur, want = sorted(set(current)), sorted(set(desired))
    adds = [k for k in want if k not in set(cur)]
    removes = [k for k in cur if k not in set(want)]
    pairs, extra_adds, extra_removes = _pair(adds, removes)
    if capacity is None:
        # extra replicas start together (engines load in parallel), each registered once ready
        steps: list[Step] = [Step(a, k) for a in ADD for k in extra_adds]
        for new, old in pairs:
            steps += [Step(a, new) for a in ADD] + [Step(a, old) for a in REMOVE]
        steps.append(Step("publish_plan"))
        return steps + [Step(a, k) for k in extra_removes for a in REMOVE]
    return _capacity_aware(cur, pairs, extra_adds, extra_removes, {k.tier for k in want}, capacity)


def _capacity_aware(
    cur: list[ReplicaKey],
    pairs: list[tuple[ReplicaKey, ReplicaKey]],
    extra_adds: list[ReplicaKey],
    extra_removes: list[ReplicaKey],
    kept_tiers: set[str],
    capacity: Mapping[str, int],
) -> list[Step]:
    used = Counter()
    for k in cur:
        used[k.gpu] += k.gpus
    registered = Counter(k.tier for k in cur)
    steps: list[Step] = []

    def fits(k: ReplicaKey) -> bool:
        return used[k.gpu] + k.gpus <= capacity.get(k.gpu, 0)

    def add(k: ReplicaKey) -> None:
        steps.extend(Step(a, k) for a in ADD)
        used[k.gpu] += k.gpus
        registered[k.tier] += 1

    def remove(k: ReplicaKey) -> None:
        steps.extend(Step(a, k) for a in REMOVE)
        used[k.gpu] -= k.gpus
        registered[k.tier] -= 1

    adds, swaps = list(extra_adds), list(pairs)
    # retired early only when their tier stays in the new plan (it keeps load) and keeps another replica
    early = [k for k in extra_removes if k.tier in kept_tiers]
    while adds or swaps:
        ready = [k for k in adds if fits(k)]
        for k in ready:  # extra replicas that fit start together
            adds.remove(k)
            add(k)
        mbb = next(((n, o) for n, o in swaps if fits(n)), None)
        if mbb is not None:  # make before break
            swaps.remove(mbb)
            add(mbb[0])
            remove(mbb[1])
            continue
        if ready:
            continue
        bbm = next(
            (
                (n, o)
                for n, o in swaps
                if registered[o.tier] > 1
                and used[n.gpu] - (o.gpus if o.gpu == n.gpu else 0) + n.gpus <= capacity.get(n.gpu, 0)
            ),
            None,
        )
        if bbm is not None:  # break before make: the tier keeps serving on its other replicas
            swaps.remove(bbm)
            remove(bbm[1])
            add(bbm[0])
            continue
        short = {k.gpu for k in adds} | {n.gpu for n, _ in swaps}
        retire = next((k for k in early if registered[k.tier] > 1 and k.gpu in short), None)
        if retire is not None:
            early.remove(retire)
            extra_removes.remove(retire)
            remove(retire)
            continue
        for k in adds:  # nothing frees room: the target will say which GPU type is short
            add(k)
        for n, o in swaps:
            add(n)
            remove(o)
        break
    steps.append(Step("publish_plan"))
    return steps + [Step(a, k) for k in extra_removes for a in REMOVE]


def registered_trace(current: Iterable[ReplicaKey], steps: Sequence[Step]) -> list[dict[str, int]]:
    """Registered replicas per tier after each step (for checking the never-empty guarantee)."""
    reg: dict[str, set[ReplicaKey]] = {}
    for k in current:
        reg.setdefault(k.tier, set()).add(k)
    trace = []
    for s in steps:
        if s.action == "register" and s.replica is not None:
            reg.setdefault(s.replica.tier, set()).add(s.replica)
        elif s.action == "deregister" and s.replica is not None:
            reg.get(s.replica.tier, set()).discard(s.replica)
        trace.append({t: len(v) for t, v in reg.items()})
    return trace


class RolloutError(Exception):
    """A step failed; steps before it took effect, the old replicas of unfinished swaps still serve."""


def execute(
    steps: Sequence[Step],
    ops: Mapping[Action, Callable[[ReplicaKey | None], None]],
    on_step: Callable[[int, Step], None] | None = None,
    on_fail: Callable[[Step, Exception], None] | None = None,
) -> None:
    """Run ``steps`` in order. A failing step stops the rollout (``on_fail`` cleans up, e.g. stops the new
    replica that never got ready); since a replica is never deregistered before its successor is
    registered, the fleet stays serving on what it had."""
    for i, step in enumerate(steps):
        try:
            ops[step.action](step.replica)
        except Exception as exc:
            if on_fail is not None:
                on_fail(step, exc)
            raise RolloutError(f"rollout stopped at step {i + 1}/{len(steps)} ({step}): {exc}") from exc
        if on_step is not None:
            on_step(i, step)
