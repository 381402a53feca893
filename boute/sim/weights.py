"""The weights a plan's replicas are balanced by, for the gateway: the simulator's rule, carried by the plan.

The simulator places each request on the replica with the least ``(outstanding + 1) / weight``, the weight
being one replica's capacity under the workload's request lengths
(:func:`boute.sim.capacity.replica_weights`). The gateway balances the same way, so it must divide by the
same figures: :func:`plan_balance` computes them under the plan's own workload when the plan is written
(``Plan.balance``), and :func:`plan_weights` gives them back to the gateway, for the plan's groups and for
any other hardware its registry lists (a replica of the previous plan during a rolling update), by the
same rule under the same lengths.

A plan written before plans carried these figures gets them from the same function: under its own
scenario's workload where it can be rebuilt (the inline scenario, or the built-in one it names), else
under :data:`REFERENCE_LENGTHS`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from boute.catalog import Catalog
from boute.errors import BouteError
from boute.sim.capacity import Lengths, replica_weights
from boute.sim.timing import DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_RUNNING, build_timing
from boute.specs.plan import Balance, Plan, ReplicaGroup, RequestLengths
from boute.specs.scenario import Scenario
from boute.workload import Workload

log = logging.getLogger("boute.sim.weights")

#: lengths for a plan whose workload cannot be rebuilt (GSM8K-like: a short prompt, a medium answer)
REFERENCE_LENGTHS = RequestLengths(mean_input=256, input_sq_mean=256**2, mean_output=256, output_sq_mean=256**2)

#: a replica's hardware as the balancer knows it: model, GPU, TP, PP, dtype
Hardware = tuple[str, str, int, int, str]


def request_lengths(workload: Workload) -> RequestLengths:
    """The moments of ``workload``'s request lengths, as the simulator computes them."""
    ln = Lengths.of(workload.input_tokens, workload.output_tokens)
    return RequestLengths(
        mean_input=ln.mean_in, input_sq_mean=ln.in_sq, mean_output=ln.mean_out, output_sq_mean=ln.out_sq
    )


def _lengths(rl: RequestLengths) -> Lengths:
    return Lengths(rl.mean_input, rl.input_sq_mean, rl.mean_output, rl.output_sq_mean)


def plan_balance(deployment: Sequence[ReplicaGroup], scenario: Scenario, workload: Workload | None = None) -> Balance:
    """Each group's replica capacity under ``workload`` (default: the scenario's own, the one the optimiser's
    evaluators judge plans on), with the scenario's catalog and calibration: what the simulator divides by.
    InfeasibleError when a group cannot serve its model."""
    from boute.sim.engine import group_timings
    from boute.workload import build_workload

    wl = build_workload(scenario) if workload is None else workload
    rl = request_lengths(wl)
    timings = group_timings(deployment, scenario, DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_RUNNING)
    return Balance(lengths=rl, capacity_rps=replica_weights(timings, _lengths(rl)))


def replica_capacity(catalog: Catalog, hw: Hardware, lengths: RequestLengths) -> float | None:
    """One replica's capacity (req/s) under ``lengths`` by the simulator's rule; None when the hardware is
    unknown to ``catalog`` or the model does not fit."""
    from boute.perf import replica_perf

    model, gpu, tp, pp, dtype = hw
    if model not in catalog.models or gpu not in catalog.gpus:
        return None
    perf = replica_perf(catalog.model(model), catalog.gpu(gpu), tp=tp, pp=pp, dtype=dtype)
    if not perf.fits:
        return None
    tm = build_timing(perf, DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_RUNNING)
    return replica_weights([tm], _lengths(lengths))[0]


def group_hardware(g: ReplicaGroup) -> Hardware:
    return (g.model, g.gpu, g.tp, g.pp, g.dtype)


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
    from boute.serving.bundle import plan_scenario
    from boute.specs import load_scenario

    if plan.scenario_spec:
        return plan_scenario(plan, "plan", root)
    if plan.scenario and plan.scenario.startswith("builtin:"):
        return load_scenario(plan.scenario)
    return None


def plan_weights(plan: Plan | None, root: Path | None = None) -> Weights:
    """What the gateway balances ``plan``'s replicas by (see module doc); ``root``: where the plan's bundle
    files are, for a plan without ``balance`` whose scenario reads a trace or profile from there."""
    from boute.catalog import builtin_catalog
    from boute.serving.bundle import plan_catalog

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
