"""What the gateway balances a plan's replicas by: the plan's own figures, or the simulator's rule applied again.

The simulator's rule and the figures a plan is written with are :mod:`boute.sim.weights` (``Plan.balance``,
computed under the plan's own workload when it is written). :func:`plan_weights` gives them back to the
gateway, for the plan's groups and for any other hardware its registry lists (a replica of the previous
plan during a rolling update), by the same rule under the same lengths. It sits here, above the simulator,
because it reads the plan's bundle (its catalog, its inline scenario).

A plan written before plans carried these figures gets them from the same function: under its own
scenario's workload where it can be rebuilt (the inline scenario, or the built-in one it names), else
under :data:`REFERENCE_LENGTHS`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from boute.catalog import Catalog, builtin_catalog
from boute.errors import BouteError
from boute.serving.bundle import plan_catalog, plan_scenario
from boute.sim.weights import Hardware, group_hardware, plan_balance, replica_capacity
from boute.specs.plan import Plan, RequestLengths
from boute.specs.scenario import Scenario

log = logging.getLogger("boute.serving.weights")

#: lengths for a plan whose workload cannot be rebuilt (GSM8K-like: a short prompt, a medium answer)
REFERENCE_LENGTHS = RequestLengths(mean_input=256, input_sq_mean=256**2, mean_output=256, output_sq_mean=256**2)


@dataclass
class Weights:
    """Capacities of a plan's hardware under its lengths: the plan's own figures, others computed on demand
    (with the plan's catalog: the packaged one and its scenario's entries, without a calibration file,
    which lives in the bundle; such replicas are a rolling update's passing ones)."""

    lengths: RequestLengths
    catalog: Catalog
    known: dict[Hardware, float] = field(default_factory=dict)
    #: where the figures come from: ``plan`` (written with it), ``scenario`` (rebuilt) or ``reference``
    source: str = "plan"

    def of(self, hw: Hardware) -> float | None:
        """One replica's capacity on ``hw`` (None: unknown hardware or a model that does not fit)."""
        if hw not in self.known:
            cap = replica_capacity(self.catalog, hw, self.lengths)
            if cap is None:
                return None
            self.known[hw] = cap
        return self.known[hw]


def _scenario_of(plan: Plan, root: Path | None) -> Scenario | None:
    """The plan's scenario where it can be had: inline (its files under ``root``) or the built-in it names."""
    from boute.specs import load_scenario

    if plan.scenario_spec:
        return plan_scenario(plan, "plan", root)
    if plan.scenario and plan.scenario.startswith("builtin:"):
        return load_scenario(plan.scenario)
    return None


def plan_weights(plan: Plan | None, root: Path | None = None) -> Weights:
    """What the gateway balances ``plan``'s replicas by (see module doc); ``root``: where the plan's bundle
    files are, for a plan without ``balance`` whose scenario reads a trace or profile from there."""
    if plan is None:
        return Weights(REFERENCE_LENGTHS, builtin_catalog(), source="reference")
    catalog = plan_catalog(plan)
    if plan.balance is not None:
        known = {group_hardware(g): c for g, c in zip(plan.deployment, plan.balance.capacity_rps, strict=True)}
        return Weights(plan.balance.lengths, catalog, known)
    try:
        sc = _scenario_of(plan, root)
        if sc is not None:
            b = plan_balance(plan.deployment, sc)
            known = {group_hardware(g): c for g, c in zip(plan.deployment, b.capacity_rps, strict=True)}
            return Weights(b.lengths, catalog, known, source="scenario")
    except (BouteError, OSError, ValueError) as exc:  # files of the scenario not here: the reference lengths
        log.warning("plan without balance figures and its workload cannot be rebuilt (%s): reference lengths", exc)
    return Weights(REFERENCE_LENGTHS, catalog, source="reference")
