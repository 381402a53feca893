"""Discrete-event simulation of a whole plan: tiers, replica groups, load balancing, cascades.

One global loop takes, in time order, (a) the next iteration boundary any replica has planned,
(b) the next external arrival, (c) the next cascade hop (a request escalated to the next tier after a
judge delay). Replica events come first on ties, so a completion frees its KV before an arrival at the
same instant is placed. Arrivals go to a replica of their tier by capacity-aware least-outstanding
balancing: argmin over replicas of (outstanding + 1) / capacity, capacity from the perf model under the
workload's request lengths (:func:`boute.sim.capacity.replica_weights`, the rule the gateway follows too);
when the plan's affinity section is in force, by the gateway's cache-aware rule (:mod:`boute.sim.balance`).

:func:`simulate` checks the route, builds the replicas (:func:`build_replicas`) and hands them to a
:class:`Scheduler`, whose loop is a few named steps in the manner of SGLang's scheduler: ``admit`` a request
to a replica, let the replica ``finish_plan`` / ``schedule`` its iterations, ``retire`` what it finished.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from boute.errors import BouteError
from boute.perf import scenario_catalog
from boute.perf.prefix_cache import PrefixCache
from boute.sim.balance import AffinityBalancer, least_loaded
from boute.sim.capacity import Lengths, replica_weights
from boute.sim.replica import DECODE, IDLE, SimReplica
from boute.sim.result import SimResult
from boute.sim.timing import DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_RUNNING, ReplicaTiming
from boute.sim.timing_cache import gpu_price, group_timing
from boute.specs.plan import Plan, ReplicaGroup, check_plan_hardware
from boute.specs.scenario import Scenario
from boute.workload import Workload
from boute.workload.prefixes import Paths

#: seconds one judge call adds to a cascade hop, accepted or escalated: the plan's static verifier takes
#: p50 0.3 ms, p99 0.9-1.5 ms of one core (bench/results/judge.json); 2 ms allows for the gateway's
#: thread hop. An LLM judge is a generation of its own: evaluators pass its recorded mean latency as
#: ``judge_delay_s`` (:func:`boute.optimize.evaluators.base.judge_delay_of` decides which).
JUDGE_DELAY_S = 0.002


def plan_cost(deployment: Sequence[ReplicaGroup], scenario: Scenario) -> float:
    """USD per hour of a deployment at the scenario's prices: sum of price x GPUs over its groups (each GPU's
    price asked once per scenario: :func:`boute.sim.timing_cache.gpu_price`)."""
    return float(sum(gpu_price(scenario, g.gpu) * g.gpus_used for g in deployment))


def group_timings(
    deployment: Sequence[ReplicaGroup], scenario: Scenario, chunk: int, max_running: int
) -> list[ReplicaTiming]:
    """Tabulated timing of each group (:func:`boute.sim.timing_cache.group_timing`: built once per replica type
    and process); BouteError for a GPU or model the catalog lacks, InfeasibleError for a model that does not
    fit its replica."""
    return [group_timing(i, g, scenario, chunk, max_running) for i, g in enumerate(deployment)]


def draw_route(plan: Plan, n: int, seed: int) -> np.ndarray:
    """Tier index per request drawn from the plan's fractions (final tier for cascades)."""
    fr = plan.routing.fractions
    if fr is None:
        raise BouteError("plan routing gives thresholds only: pass per-request tiers (route) from the quality model")
    p = np.asarray(fr, dtype=float)
    return np.random.default_rng(seed).choice(len(p), size=n, p=p / p.sum()).astype(np.int64)


def checked_route(plan: Plan, n: int, route: np.ndarray | None, seed: int) -> np.ndarray:
    """``route`` as n tier indices of the plan (drawn from its fractions when None); BouteError otherwise."""
    tiers = len(plan.routing.tiers)
    out = draw_route(plan, n, seed) if route is None else np.asarray(route, dtype=np.int64)
    if out.shape != (n,) or (n and (out.min() < 0 or out.max() >= tiers)):
        raise BouteError(f"route must hold {n} tier indices in [0, {tiers})")
    return out


def build_replicas(
    plan: Plan, timings: Sequence[ReplicaTiming], weights: Sequence[float]
) -> tuple[list[SimReplica], list[list[SimReplica]]]:
    """Every replica of the deployment in group order, and the replicas of each tier (the balancer's pools)."""
    tiers = list(plan.routing.tiers)
    replicas: list[SimReplica] = []
    by_tier: list[list[SimReplica]] = [[] for _ in tiers]
    for gi, (g, tm, weight) in enumerate(zip(plan.deployment, timings, weights, strict=True)):
        for _ in range(g.count):
            r = SimReplica(len(replicas), tiers.index(g.tier), gi, tm, weight)
            replicas.append(r)
            by_tier[r.tier].append(r)
    return replicas, by_tier


def check_served(plan: Plan, route: np.ndarray, by_tier: Sequence[Sequence[SimReplica]]) -> None:
    """Every tier a request reaches (a cascade's: all tiers up to its last) has a replica, else BouteError."""
    tiers = plan.routing.tiers
    if plan.routing.mode == "cascade":
        needed = np.arange(int(route.max()) + 1 if len(route) else 0)
    else:
        needed = np.unique(route)
    for t in needed:
        if not by_tier[int(t)]:
            raise BouteError(f"requests are routed to tier '{tiers[int(t)]}' but the plan deploys no replica for it")


class Scheduler:
    """The global event loop of one simulation: the replicas, the two event heaps and each request's progress.

    The loop (:meth:`run`) takes, in time order, a replica's iteration boundary (:meth:`SimReplica.finish_plan`,
    then :meth:`retire` the requests it finished and :meth:`SimReplica.schedule` the next iteration), an
    external arrival or a cascade hop (:meth:`admit` to the tier's least-loaded replica). Replica events
    come first on ties, so a completion frees its KV before an arrival at the same instant is placed.
    Event heap entries: ``(time, seq, replica, version)``, hop heap entries ``(time, seq, request)``; one
    counter numbers both, so equal times leave the heaps in push order. A replica event whose version is
    stale (the replica re-planned since) is dropped.
    """

    __slots__ = (
        "replicas",
        "by_tier",
        "arrivals",
        "inp",
        "out",
        "per_tier",
        "final",
        "cur_tier",
        "cascade",
        "last",
        "judge_delay_s",
        "ttft",
        "first_final",
        "finish",
        "where",
        "rejected",
        "events",
        "hops",
        "seq",
        "balancer",
    )

    def __init__(
        self,
        replicas: list[SimReplica],
        by_tier: list[list[SimReplica]],
        workload: Workload,
        route: np.ndarray,
        *,
        cascade: bool,
        last: int,
        judge_delay_s: float,
        balancer: AffinityBalancer | None = None,
    ) -> None:
        """``balancer``: the affinity rule placing requests within a tier (None: least load)."""
        n = len(workload.arrival_s)
        self.replicas = replicas
        self.by_tier = by_tier
        self.arrivals: list[float] = workload.arrival_s.tolist()
        self.inp: list[int] = workload.input_tokens.tolist()
        # the answer length of the tier a request is at: set again at each hop (admit), since a cascade's
        # tiers each generate their own answer (Workload.output_at)
        tier_out = workload.tier_output_tokens
        self.per_tier: list[list[int]] | None = tier_out.tolist() if tier_out is not None else None
        self.out: list[int] = workload.output_tokens.tolist()
        self.final: list[int] = route.tolist()
        self.cur_tier = [0] * n if cascade else list(self.final)
        self.cascade = cascade
        self.last = last
        self.judge_delay_s = judge_delay_s
        self.ttft = [math.nan] * n
        self.first_final = [math.nan] * n
        self.finish = [math.inf] * n
        self.where = [-1] * n
        self.rejected = [False] * n
        self.events: list[tuple[float, int, int, int]] = []
        self.hops: list[tuple[float, int, int]] = []
        self.seq = itertools.count(1)
        self.balancer = balancer

    def push(self, r: SimReplica) -> None:
        """Put the replica's planned iteration boundary on the event heap (nothing when it is idle)."""
        if r.plan != IDLE:
            heapq.heappush(self.events, (r.plan_end, next(self.seq), r.index, r.version))

    def admit(self, rid: int, t: float) -> None:
        """Request ``rid`` reaches its current tier at ``t``: onto the replica with the least (outstanding + 1)
        / weight (or the affinity rule's, :attr:`balancer`), or rejected when its prompt + answer exceed that
        replica's KV. An idle replica starts on it at once; a decoding one cuts its jump at the next step
        boundary when it can take it now."""
        tier = self.cur_tier[rid]
        pool = self.by_tier[tier]
        out = self.out
        if self.per_tier is not None:
            out[rid] = self.per_tier[rid][tier]
        best = least_loaded(pool) if self.balancer is None else self.balancer.pick(rid, tier, pool)
        inp = self.inp
        need = inp[rid] + out[rid]
        if need > best.timing.kv_capacity:
            self.rejected[rid] = True
            return
        self.where[rid] = best.index
        best.outstanding += 1
        best.waiting.append(rid)
        if best.plan == IDLE:
            best.now = t
            best.schedule(inp, out)
            self.push(best)
        elif (
            best.plan == DECODE
            and len(best.waiting) == 1
            and best.partial < 0
            and best.can_admit(need)
            and best.cut_decode(t)
        ):
            best.schedule(inp, out)
            self.push(best)

    def retire(self, r: SimReplica, done: list[int]) -> None:
        """The requests replica ``r`` just finished: a cascade hop to the next tier after the judge, or done."""
        now = r.now
        cascade, final, cur_tier = self.cascade, self.final, self.cur_tier
        for rid in done:
            if cascade and cur_tier[rid] < final[rid]:
                heapq.heappush(self.hops, (now + self.judge_delay_s, next(self.seq), rid))
            elif cascade and final[rid] < self.last:
                # accepted before the last tier: the gateway held the whole answer for the judge,
                # then sends it at once, so its first token reaches the client with the last
                self.finish[rid] = self.first_final[rid] = now + self.judge_delay_s
            else:
                self.finish[rid] = now
                self.first_final[rid] = self.ttft[rid]
        done.clear()

    def run(self, limit: float) -> bool:
        """Process events in time order until none is left; True when stopped at ``limit`` (capped)."""
        arrivals, events, hops, replicas = self.arrivals, self.events, self.hops, self.replicas
        inp, out, ttft, cur_tier = self.inp, self.out, self.ttft, self.cur_tier
        admit, retire, seq = self.admit, self.retire, self.seq
        heappop, heappush = heapq.heappop, heapq.heappush
        n = len(arrivals)
        done: list[int] = []
        nxt = 0
        inf = math.inf
        while True:
            t_ext = arrivals[nxt] if nxt < n else inf
            t_hop = hops[0][0] if hops else inf
            t_ev = events[0][0] if events else inf
            if t_ev <= t_ext and t_ev <= t_hop:
                if t_ev == inf:
                    return False
                if t_ev > limit:
                    return True
                _, _, ri, ver = heappop(events)
                r = replicas[ri]
                if ver != r.version:
                    continue
                r.finish_plan(inp, out, ttft, done)
                if done:
                    retire(r, done)
                r.schedule(inp, out)
                if r.plan != IDLE:
                    heappush(events, (r.plan_end, next(seq), r.index, r.version))
            elif t_ext <= t_hop:
                if t_ext > limit:
                    return True
                admit(nxt, t_ext)
                nxt += 1
            else:
                if t_hop > limit:
                    return True
                _, _, rid = heappop(hops)
                cur_tier[rid] += 1
                admit(rid, t_hop)


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
    Within a tier, requests are balanced by least load, or by the gateway's cache-aware rule where the plan's
    ``affinity`` section is in force (:mod:`boute.sim.balance`; ``SimResult.affinity_reason`` says why each
    request went where it did).
    """
    wall0 = time.perf_counter()
    check_plan_hardware(plan, scenario_catalog(scenario), "plan")
    route = checked_route(plan, len(workload.arrival_s), route, seed)
    timings = group_timings(plan.deployment, scenario, chunk_tokens, max_running)
    weights = replica_weights(timings, Lengths.of(workload.input_tokens, workload.output_tokens))
    replicas, by_tier = build_replicas(plan, timings, weights)
    check_served(plan, route, by_tier)
    # the prompts' cache paths under this route (an earlier turn's answer is its final tier's), built once for
    # the replicas' caches and the affinity keys
    paths = workload.prefixes.paths(route) if workload.prefixes is not None else None
    cached = with_prefix_caches(replicas, len(workload), paths)
    affinity = plan.affinity_in_force()
    balancer = AffinityBalancer(affinity, by_tier, workload, paths) if affinity is not None else None
    loop = Scheduler(
        replicas,
        by_tier,
        workload,
        route,
        cascade=plan.routing.mode == "cascade",
        last=len(plan.routing.tiers) - 1,
        judge_delay_s=judge_delay_s,
        balancer=balancer,
    )
    horizon = float(workload.duration_s)
    capped = loop.run(max_sim_time_s if max_sim_time_s is not None else 10.0 * horizon + 600.0)
    result = _result(plan, scenario, workload, route, timings, loop, capped=capped, wall0=wall0)
    if cached is None:
        return result
    return replace(result, cached_tokens=np.asarray(cached, dtype=np.int64), prompt_tokens=workload.input_tokens)


def with_prefix_caches(replicas: Sequence[SimReplica], requests: int, paths: Paths | None) -> list[int] | None:
    """Give every replica a prefix cache the size of its KV pool when the prompts share prefixes (``paths``, the
    prompts' :class:`boute.workload.prefixes.Paths`); the list each request's hit (at the last replica that
    served it) is written to, else None."""
    if paths is None:
        return None
    cached = [0] * requests
    for r in replicas:
        r.cache = PrefixCache(r.timing.kv_capacity)
        r.paths = paths
        r.cached = cached
    return cached


def _result(
    plan: Plan,
    scenario: Scenario,
    workload: Workload,
    route: np.ndarray,
    timings: Sequence[ReplicaTiming],
    loop: Scheduler,
    *,
    capped: bool,
    wall0: float,
) -> SimResult:
    """The per-request timings of a finished loop as latencies, with the replicas' aggregates.

    A request's TTFT is its final tier's first token (``first_final``) less its arrival; its TPOT spreads
    the final tier's remaining ``out - 1`` tokens over ``finish - first_final`` (0 for one-token answers).
    """
    arr = workload.arrival_s
    fin = np.asarray(loop.finish)
    first = np.asarray(loop.first_final)
    final_out = workload.output_at(route)
    denom = np.maximum(final_out - 1, 1)
    tpot = np.where(final_out > 1, (fin - first) / denom, 0.0)
    replicas = loop.replicas
    return SimResult(
        arrival_s=arr,
        ttft_s=first - arr,
        tpot_s=tpot,
        e2e_s=fin - arr,
        tier=route.copy(),
        replica=np.asarray(loop.where, dtype=np.int64),
        rejected=np.asarray(loop.rejected, dtype=bool),
        tiers=tuple(plan.routing.tiers),
        replica_tier=np.asarray([r.tier for r in replicas], dtype=np.int64),
        replica_group=np.asarray([r.group for r in replicas], dtype=np.int64),
        replica_busy_s=np.asarray([r.busy_s for r in replicas]),
        replica_served=np.asarray([r.served for r in replicas], dtype=np.int64),
        replica_weight=np.asarray([r.weight for r in replicas]),
        duration_s=float(workload.duration_s),
        cost_per_hour=plan_cost(plan.deployment, scenario),
        p95_target_s=float(scenario.targets.p95_latency_s),
        capped=capped,
        sim_end_s=max((r.now for r in replicas), default=0.0),
        wall_s=time.perf_counter() - wall0,
        timing_error=max((tm.max_rel_error for tm in timings), default=0.0),
        affinity_reason=None if loop.balancer is None else loop.balancer.reason,
    )
