"""The weights a plan's replicas are balanced by: the simulator's rule, computed where the plan is written.

The simulator places each request on the replica with the least ``(outstanding + 1) / weight``, the weight
being one replica's capacity under the workload's request lengths
(:func:`boute.sim.capacity.replica_weights`). The gateway balances the same way, so it must divide by the
same figures: :func:`plan_balance` computes them under the plan's own workload when the plan is written
(``Plan.balance``), and :func:`replica_capacity` computes one replica's by the same rule for hardware the
plan does not list. What the gateway asks for a plan (its figures, or a fallback for a plan written
without them) is :mod:`boute.serving.weights`, one layer up: it needs the plan's bundle.
"""

from __future__ import annotations

from collections.abc import Sequence

from boute.catalog import Catalog
from boute.sim.capacity import Lengths, replica_weights
from boute.sim.timing import DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_RUNNING, build_timing
from boute.specs.plan import Balance, ReplicaGroup, RequestLengths
from boute.specs.scenario import Scenario
from boute.workload import Workload

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
