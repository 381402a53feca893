"""Discrete-event simulation of a whole plan: tiers, replica groups, load balancing, cascades.

One global loop takes, in time order, (a) the next iteration boundary any replica has planned,
(b) the next external arrival, (c) the next cascade hop (a request escalated to the next tier after a
judge delay). Replica events come first on ties, so a completion frees its KV before an arrival at the
same instant is placed. Arrivals go to a replica of their tier by capacity-aware least-outstanding
balancing: argmin over replicas of (outstanding + 1) / capacity, capacity from the perf model under the
workload's request lengths (:func:`boute.sim.capacity.replica_weights`, the rule the gateway follows too).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence

import numpy as np

from boute.errors import BouteError, InfeasibleError
from boute.perf import replica_perf, scenario_catalog
from boute.sim.capacity import Lengths, replica_weights
from boute.sim.replica import DECODE, IDLE, SimReplica
from boute.sim.result import SimResult
from boute.sim.timing import DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_RUNNING, ReplicaTiming, build_timing
from boute.specs.plan import Plan, ReplicaGroup, check_plan_hardware
from boute.specs.scenario import Scenario
from boute.workload import Workload

#: seconds one judge call adds to a cascade hop, accepted or escalated: the plan's static verifier takes
#: p50 0.3 ms, p99 0.9-1.5 ms of one core (bench/results/judge.json); 2 ms allows for the gateway's
#: thread hop. An LLM judge is a generation of its own: evaluators pass its recorded mean latency as
#: ``judge_delay_s`` (:func:`boute.optimize.evaluators.base.judge_delay_of` decides which).
JUDGE_DELAY_S = 0.002


def plan_cost(deployment: Sequence[ReplicaGroup], scenario: Scenario) -> float:
    """USD per hour of a deployment at the scenario's prices."""
    return float(sum(scenario.price(g.gpu) * g.gpus_used for g in deployment))


def group_label(i: int, g: ReplicaGroup) -> str:
    return f"deployment[{i}] ({g.tier}: {g.count}x {g.model} on {g.gpu}, tp={g.tp}, pp={g.pp}, {g.dtype})"


def group_timings(
    deployment: Sequence[ReplicaGroup], scenario: Scenario, chunk: int, max_running: int
) -> list[ReplicaTiming]:
    """Tabulated timing of each group; a group whose model does not fit raises InfeasibleError."""
    cat = scenario_catalog(scenario)
    out = []
    for i, g in enumerate(deployment):
        if g.gpu not in cat.gpus or g.model not in cat.models:
            raise BouteError(f"{group_label(i, g)}: unknown {'GPU' if g.gpu not in cat.gpus else 'model'}")
        perf = replica_perf(cat.model(g.model), cat.gpu(g.gpu), tp=g.tp, pp=g.pp, dtype=g.dtype)
        if not perf.fits:
            raise InfeasibleError(f"{group_label(i, g)} cannot serve its model: {perf.reason}")
        out.append(build_timing(perf, chunk=chunk, max_running=max_running))
    return out


def draw_route(plan: Plan, n: int, seed: int) -> np.ndarray:
    """Tier index per request drawn from the plan's fractions (final tier for cascades)."""
    fr = plan.routing.fractions
    if fr is None:
        raise BouteError("plan routing gives thresholds only: pass per-request tiers (route) from the quality model")
    p = np.asarray(fr, dtype=float)
    return np.random.default_rng(seed).choice(len(p), size=n, p=p / p.sum()).astype(np.int64)


def simulate(
    plan: Plan,
    scenario: Scenario,
    workload: Workload,
    route: np.ndarray | None = None,
    *,
    seed: int = 0,
    judge_delay_s: float = JUDGE_DELAY_S,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    max_running: int = DEFAULT_MAX_RUNNING,
    max_sim_time_s: float | None = None,
) -> SimResult:
    """Simulate ``workload`` on ``plan`` until every request finishes (or ``max_sim_time_s``).

    ``route[i]`` is request i's tier (preroute) or the last tier it reaches (cascade: it is served by
    tiers 0..route[i] in turn, each a full generation, and every tier but the last then waits
    ``judge_delay_s`` for the judge: before escalating, and before an accepted answer is returned). Each
    tier generates its own answer length where the workload has them (``Workload.tier_output_tokens``).
    """
    wall0 = time.perf_counter()
    check_plan_hardware(plan, scenario_catalog(scenario), "plan")
    tiers = list(plan.routing.tiers)
    n = len(workload.arrival_s)
    route = draw_route(plan, n, seed) if route is None else np.asarray(route, dtype=np.int64)
    if route.shape != (n,) or (n and (route.min() < 0 or route.max() >= len(tiers))):
        raise BouteError(f"route must hold {n} tier indices in [0, {len(tiers)})")
    cascade = plan.routing.mode == "cascade"
    last = len(tiers) - 1
    timings = group_timings(plan.deployment, scenario, chunk_tokens, max_running)

    inp = workload.input_tokens.tolist()
    # the answer length of the tier a request is at: set again at each hop (place), since a cascade's
    # tiers each generate their own answer (Workload.output_at)
    per_tier = workload.tier_output_tokens.tolist() if workload.tier_output_tokens is not None else None
    out = workload.output_tokens.tolist()
    weights = replica_weights(timings, Lengths.of(workload.input_tokens, workload.output_tokens))
    replicas: list[SimReplica] = []
    by_tier: list[list[SimReplica]] = [[] for _ in tiers]
    for gi, (g, tm, weight) in enumerate(zip(plan.deployment, timings, weights, strict=True)):
        for _ in range(g.count):
            r = SimReplica(len(replicas), tiers.index(g.tier), gi, tm, weight)
            replicas.append(r)
            by_tier[r.tier].append(r)
    needed = np.unique(route) if not cascade else np.arange(int(route.max()) + 1 if n else 0)
    for t in needed:
        if not by_tier[int(t)]:
            raise BouteError(f"requests are routed to tier '{tiers[int(t)]}' but the plan deploys no replica for it")

    arrivals = workload.arrival_s.tolist()
    final = route.tolist()
    cur_tier = [0] * n if cascade else list(final)
    enter = list(arrivals)  # when the request reached its current tier
    ttft = [math.nan] * n
    first_final = [math.nan] * n
    finish = [math.inf] * n
    where = [-1] * n
    rejected = [False] * n
    horizon = float(workload.duration_s)
    limit = max_sim_time_s if max_sim_time_s is not None else 10.0 * horizon + 600.0

    events: list[tuple[float, int, int, int]] = []  # (time, seq, replica, version)
    hops: list[tuple[float, int, int]] = []  # (time, seq, request)
    seq = 0
    done: list[int] = []
    nxt = 0
    inf = math.inf
    capped = False

    def push(r: SimReplica) -> None:
        nonlocal seq
        if r.plan != IDLE:
            seq += 1
            heapq.heappush(events, (r.plan_end, seq, r.index, r.version))

    def place(rid: int, t: float) -> None:
        pool = by_tier[cur_tier[rid]]
        if per_tier is not None:
            out[rid] = per_tier[rid][cur_tier[rid]]
        best = pool[0]
        if len(pool) > 1:
            best_v = (best.outstanding + 1) / best.weight
            for r in pool[1:]:
                v = (r.outstanding + 1) / r.weight
                if v < best_v:
                    best, best_v = r, v
        need = inp[rid] + out[rid]
        if need > best.timing.kv_capacity:
            rejected[rid] = True
            return
        enter[rid] = t
        where[rid] = best.index
        best.outstanding += 1
        best.waiting.append(rid)
        if best.plan == IDLE:
            best.now = t
            best.schedule(inp, out)
            push(best)
        elif (
            best.plan == DECODE
            and len(best.waiting) == 1
            and best.partial < 0
            and best.can_admit(need)
            and best.cut_decode(t)
        ):
            best.schedule(inp, out)
            push(best)

    while True:
        t_ext = arrivals[nxt] if nxt < n else inf
        t_hop = hops[0][0] if hops else inf
        t_ev = events[0][0] if events else inf
        if t_ev <= t_ext and t_ev <= t_hop:
            if t_ev == inf:
                break
            if t_ev > limit:
                capped = True
                break
            _, _, ri, ver = heapq.heappop(events)
            r = replicas[ri]
            if ver != r.version:
                continue
            r.finish_plan(inp, out, ttft, done)
            if done:
                for rid in done:
                    if cascade and cur_tier[rid] < final[rid]:
                        seq += 1
                        heapq.heappush(hops, (r.now + judge_delay_s, seq, rid))
                    elif cascade and final[rid] < last:
                        # accepted before the last tier: the gateway held the whole answer for the judge,
                        # then sends it at once, so its first token reaches the client with the last
                        finish[rid] = first_final[rid] = r.now + judge_delay_s
                    else:
                        finish[rid] = r.now
                        first_final[rid] = ttft[rid]
                done.clear()
            r.schedule(inp, out)
            push(r)
        elif t_ext <= t_hop:
            if t_ext > limit:
                capped = True
                break
            place(nxt, t_ext)
            nxt += 1
        else:
            if t_hop > limit:
                capped = True
                break
            _, _, rid = heapq.heappop(hops)
            cur_tier[rid] += 1
            place(rid, t_hop)

    arr = workload.arrival_s
    fin = np.asarray(finish)
    first = np.asarray(first_final)
    e2e = fin - arr
    ttft_s = first - arr
    # the final tier's generation: first token at `first`, then (out - 1) more tokens until `fin`
    final_out = workload.output_at(route)
    denom = np.maximum(final_out - 1, 1)
    tpot = np.where(final_out > 1, (fin - first) / denom, 0.0)
    rep_tier = np.asarray([r.tier for r in replicas], dtype=np.int64)
    return SimResult(
        arrival_s=arr,
        ttft_s=ttft_s,
        tpot_s=tpot,
        e2e_s=e2e,
        tier=route.copy(),
        replica=np.asarray(where, dtype=np.int64),
        rejected=np.asarray(rejected, dtype=bool),
        tiers=tuple(tiers),
        replica_tier=rep_tier,
        replica_group=np.asarray([r.group for r in replicas], dtype=np.int64),
        replica_busy_s=np.asarray([r.busy_s for r in replicas]),
        replica_served=np.asarray([r.served for r in replicas], dtype=np.int64),
        replica_weight=np.asarray([r.weight for r in replicas]),
        duration_s=horizon,
        cost_per_hour=plan_cost(plan.deployment, scenario),
        p95_target_s=float(scenario.targets.p95_latency_s),
        capped=capped,
        sim_end_s=max((r.now for r in replicas), default=0.0),
        wall_s=time.perf_counter() - wall0,
        timing_error=max((tm.max_rel_error for tm in timings), default=0.0),
    )
