"""Which replica of its tier a simulated request goes to: least load, or the gateway's cache-aware rule.

Least load (always, and where the affinity rule defers to it): the replica with the fewest
``(outstanding + 1) / weight``, the first such in pool order on ties (:func:`least_loaded`; the gateway's
rule, :mod:`router.balancer`, with its own tie order).

With the plan's affinity in force (:meth:`boute.specs.plan.Plan.affinity_in_force`), :class:`AffinityBalancer`
asks the gateway's own rule object (:class:`boute.sim.affinity.AffinityIndex`, one per tier) with the keys the
gateway would have hashed (:func:`boute.sim.affinity.path_keys`) and the loads the simulator has, so a plan is
judged under the balancing it will be served with. What differs from the gateway, and why it may:

- *weights*: the gateway divides by each replica's capacity over its tier's mean (``Balancer.configure``);
  so does this, since the imbalance test's ``balance_abs`` is in those units (outstanding requests per replica
  of average capacity). Least load and the rendezvous choice do not depend on the scale;
- *prompts without prefix information* (``workload.prefixes`` None): each gets one segment of its own, so its
  first block is new, as the gateway sees prompts that share nothing: the rendezvous choice with bounded load;
- *availability*: simulated replicas never fail, so nothing is ever forgotten (``AffinityIndex.forget``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from boute.sim.affinity import REASONS, AffinityIndex, PromptKeys, path_keys
from boute.sim.replica import SimReplica
from boute.specs.balancing import Affinity
from boute.workload import Workload
from boute.workload.prefixes import Paths

#: ``AffinityBalancer.reason`` of a request the rule never placed
UNROUTED = -1


def least_loaded(pool: Sequence[SimReplica]) -> SimReplica:
    """The replica with the least ``(outstanding + 1) / weight``, the first in pool order on ties (non-empty)."""
    best = pool[0]
    if len(pool) > 1:
        best_v = (best.outstanding + 1) / best.weight
        for r in pool[1:]:
            v = (r.outstanding + 1) / r.weight
            if v < best_v:
                best, best_v = r, v
    return best


class AffinityBalancer:
    """The gateway's affinity rule over the simulator's tiers (module docstring): one index per tier, each
    request's keys derived once (a cascade's hops reuse them), and why each request went where it went."""

    __slots__ = ("indexes", "names", "weights", "settings", "workload", "paths", "keys", "reason")

    def __init__(
        self, settings: Affinity, by_tier: Sequence[Sequence[SimReplica]], workload: Workload, paths: Paths | None
    ) -> None:
        """``paths``: the prompts' cache paths under the simulation's route (None: the prompts share nothing)."""
        self.settings = settings
        self.indexes = [AffinityIndex(settings) for _ in by_tier]
        self.names = [[str(r.index) for r in pool] for pool in by_tier]
        self.weights = [_relative(pool) for pool in by_tier]
        self.workload = workload
        self.paths = paths
        self.keys: dict[int, PromptKeys] = {}
        #: per request, the position in :data:`~boute.sim.affinity.REASONS` of why its last placement went
        #: where it did (:data:`UNROUTED`: never placed)
        self.reason = np.full(len(workload), UNROUTED, dtype=np.int8)

    def pick(self, rid: int, tier: int, pool: Sequence[SimReplica]) -> SimReplica:
        """Request ``rid``'s replica in ``pool`` (its tier's) by the rule, least load where it says so; the choice
        is recorded in the tier's index for the request's keys."""
        keys = self.keys.get(rid)
        if keys is None:
            keys = self.keys[rid] = self._keys_of(rid)
        index, names = self.indexes[tier], self.names[tier]
        route = index.choose(keys, names, [r.outstanding for r in pool], self.weights[tier])
        if route.choice is None:
            best = least_loaded(pool)
            j = pool.index(best)
        else:
            j = route.choice
            best = pool[j]
        index.record(keys.keys, names[j])
        self.reason[rid] = REASONS.index(route.reason)
        return best

    def _keys_of(self, rid: int) -> PromptKeys:
        """The keys the gateway would hash for request ``rid``'s prompt (module docstring)."""
        if self.paths is not None:
            return path_keys(self.paths.prompt(rid), self.settings)
        # a prompt that shares nothing: one segment no other request holds (node ids of the tree are >= 0)
        return path_keys(((-1 - rid, int(self.workload.input_tokens[rid])),), self.settings)


def _relative(pool: Sequence[SimReplica]) -> list[float]:
    """The pool's weights over their mean: the gateway's units (module docstring)."""
    if not pool:
        return []
    mean = sum(r.weight for r in pool) / len(pool)
    return [r.weight / mean for r in pool]
