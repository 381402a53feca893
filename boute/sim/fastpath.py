"""Analytical fast path: a queueing approximation of a plan, ~thousands of evaluations per second.

Per replica group (see :mod:`boute.sim.capacity`): the capacity ``mu`` (req/s) at the KV-limited batch,
and at the offered load the mean decode batch, step time ``step`` and prefill share ``phi`` (Little's law
fixed point). The balancer is capacity-aware least-outstanding, as the gateway's and the simulator's are
(:func:`boute.sim.load_curves.balance`): at light load slow replicas get less than their capacity share; a
tier's utilisation is ``rho = lambda_tier / sum(mu)``.

A request of output length O then takes ``A + tau * (O - 1)`` plus any wait for a KV slot, with
``tau = step / (1 - phi)`` (decode slowed by prefill stalls) and ``A`` its time to first token (half an
iteration of residual wait plus its own batched prefill). The wait for a slot treats the tier as one
G/G/c queue with c = its total KV-limited batch slots (least-outstanding balancing approximates a shared
queue): Erlang-C probability from the Halfin-Whitt approximation, scaled by Allen-Cunneen's
``(ca^2 + cs^2) / 2``. O is gamma-distributed (fitted to the mean and second moment of output lengths);
the variable part is moment-matched to a gamma per group (or per cascade path, whose hops add up), and
P50/P95 come from the mixture over groups weighted by their share of requests.

Unstable (some tier with rho >= 1): ``stable=False`` and P50/P95/mean are ``inf`` (callers that need a
finite objective should clip). Approximate by construction; tests check it against the simulator.

This module composes the pieces: per-replica load curves and balancing (:mod:`boute.sim.load_curves`, cached
across calls), the queue formulas (:mod:`boute.sim.queueing`) and the gamma mixture's quantiles
(:mod:`boute.sim.gamma_mixture`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from boute.sim.capacity import Lengths
from boute.sim.confidence import BASE_BAND, Confidence, assess, needs_confirmation
from boute.sim.engine import JUDGE_DELAY_S, plan_cost
from boute.sim.gamma_mixture import mixture_quantiles
from boute.sim.load_curves import balance, capacity_and_slots
from boute.sim.queueing import erlang_c, pooling
from boute.sim.timing import DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_RUNNING, ReplicaTiming
from boute.sim.timing_cache import group_timing, on_evict
from boute.specs.plan import ReplicaGroup
from boute.specs.scenario import Scenario
from boute.workload import WorkloadStats


@dataclass(frozen=True)
class FastResult:
    p95_latency_s: float
    p50_latency_s: float
    mean_latency_s: float
    throughput_rps: float  # sustained at the offered rate (<= rate)
    capacity_rps: float  # largest offered rate this deployment + split sustains
    utilisation: tuple[float, ...]  # per tier, offered / capacity
    stable: bool
    cost_per_hour: float
    #: how far to trust p95_latency_s (see :mod:`boute.sim.confidence`); ``uncertain`` -> confirm by simulation
    confidence: Confidence = Confidence(BASE_BAND, ())
    #: busiest replica's prompt work per second (prefill at a full chunk's per-token cost): long-prompt pressure
    prefill_utilisation: float = 0.0

    @property
    def uncertain(self) -> bool:
        """True where the fast path is known to be weak: the optimiser should confirm with the simulator."""
        return self.confidence.uncertain

    @property
    def uncertainty_reasons(self) -> tuple[str, ...]:
        return self.confidence.reasons

    def needs_confirmation(self, p95_cap_s: float) -> bool:
        """Uncertain, or the P95 cap lies inside this evaluation's P95 band (the verdict could flip)."""
        return needs_confirmation(self.p95_latency_s, self.confidence, p95_cap_s)


#: one replica group of a tier: (timing, replica count, one replica's capacity mu in req/s, its KV-limited batch)
Group = tuple[ReplicaTiming, int, float, int]
#: one latency component of the mixture: (tier, share of the tier's requests, A, tau, prefill wait, extra variance)
Component = tuple[int, float, float, float, float, float]


def fast_evaluate(
    deployment: Sequence[ReplicaGroup],
    scenario: Scenario,
    stats: WorkloadStats,
    tier_visits: Sequence[float],
    tiers: Sequence[str],
    mode: str = "preroute",
    *,
    judge_delay_s: float = JUDGE_DELAY_S,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    max_running: int = DEFAULT_MAX_RUNNING,
    tier_stats: Sequence[WorkloadStats] | None = None,
) -> FastResult:
    """Approximate latency quantiles, capacity and cost of a deployment under a tier split (module doc).

    ``tier_stats``: the length moments of the requests each tier serves, where routing sorts prompts by
    difficulty and so by length (:func:`boute.workload.tier_workload_stats`); their rate and arrival
    coefficient of variation are not read (``stats`` gives the stream's). Default: every tier sees
    ``stats``' lengths. With a learned router the largest tier's prompts ran ~45% longer than the
    average on GSM8K lengths, so the default understates its load. In cascade mode every hop of a path
    generates its own tier's answer lengths, as each tier's load curves do.
    """
    rate = stats.rate_rps
    tiers = list(tiers)
    visits = [float(v) for v in tier_visits]
    if tier_stats is not None and len(tier_stats) != len(tiers):
        raise ValueError(f"tier_stats: expected {len(tiers)} entries (one per tier), got {len(tier_stats)}")
    by_tier = list(tier_stats) if tier_stats is not None else [stats] * len(tiers)
    lns = [Lengths(t.mean_input, t.input_sq_mean, t.mean_output, t.output_sq_mean) for t in by_tier]
    cost = plan_cost(deployment, scenario)
    per_tier = _groups_by_tier(deployment, scenario, tiers, lns, chunk_tokens, max_running)
    util = _utilisation(per_tier, rate, visits)
    worst = max(util) if util else 0.0
    capacity = rate / worst if worst > 0 else math.inf
    if worst >= 1.0:
        inf = math.inf
        conf = assess(worst, 0.0, stats.arrival_cv, False)
        return FastResult(inf, inf, inf, rate / worst, capacity, tuple(util), False, cost, conf)

    ca2 = stats.arrival_cv**2
    # per tier: answer-length variance and its squared cv, the prompts' squared cv (prefill time ~ length)
    var_k = [max(t.output_sq_mean - t.mean_output**2, 1e-6) for t in by_tier]
    cs2_k = [v / t.mean_output**2 for v, t in zip(var_k, by_tier, strict=True)]
    cs2_pf_k = [max(t.input_sq_mean / max(t.mean_input**2, 1e-9) - 1.0, 0.0) for t in by_tier]
    # per tier: load-weighted fixed part A, per-token time tau, and slot-wait moments
    cols = _TierColumns([], [], [], [])
    comps: list[Component] = []
    prefill_rho = 0.0
    for k, groups in enumerate(per_tier):
        lam_k = rate * visits[k]
        if lam_k <= 0 or not groups:
            cols.add(0.0, 0.0, 0.0, 0.0)
            continue
        ca2_k = 1.0 + visits[k] * (ca2 - 1.0) if mode == "preroute" else ca2
        row, tier_comps, prhos = _tier_terms_of(k, groups, lam_k, util[k], lns[k], cs2_k[k], cs2_pf_k[k], ca2_k)
        cols.add(*row)
        comps.extend(tier_comps)
        for prho in prhos:
            prefill_rho = max(prefill_rho, prho)

    if mode == "cascade":
        parts = _cascade_parts(visits, cols, lns, var_k, judge_delay_s)
    else:
        parts = _preroute_parts(visits, cols, lns, var_k, comps)
    p50, p95, mean = _mixture(*parts)
    conf = assess(worst, prefill_rho, stats.arrival_cv, True)
    return FastResult(p95, p50, mean, rate, capacity, tuple(util), True, cost, conf, prefill_rho)


def _groups_by_tier(
    deployment: Sequence[ReplicaGroup],
    scenario: Scenario,
    tiers: list[str],
    lns: Sequence[Lengths],
    chunk_tokens: int,
    max_running: int,
) -> list[list[Group]]:
    """The deployment's groups by tier (groups of tiers outside ``tiers`` are left out), with their
    capacity and KV-limited batch under the tier's lengths."""
    per_tier: list[list[Group]] = [[] for _ in tiers]
    for i, g in enumerate(deployment):
        if g.tier not in tiers:
            continue
        k = tiers.index(g.tier)
        per_tier[k].append(_group_of(i, g, scenario, lns[k], chunk_tokens, max_running))
    return per_tier


#: per replica group object, scenario object and lengths: the group's timing table, count, capacity and slots
#: (:func:`_group_of`); each entry holds the group and scenario it was built for, so their ids stay theirs
_GROUPS: dict[tuple, tuple[ReplicaGroup, Scenario, Group]] = {}
#: entries before :data:`_GROUPS` is emptied
MAX_GROUPS = 16384

on_evict(_GROUPS.clear)


def _group_of(i: int, g: ReplicaGroup, scenario: Scenario, ln: Lengths, chunk: int, max_running: int) -> Group:
    """Group ``i``'s (timing table, count, capacity, slots) under ``ln``, remembered per group object: a search's
    plans are made of a few thousand distinct group instances (:meth:`boute.optimize.space.Space._group`), and
    looking each one's table and capacity up again was a sixth of the fast path's time on a 480-GPU fleet."""
    key = (id(g), id(scenario), ln, chunk, max_running)
    hit = _GROUPS.get(key)
    if hit is None or hit[0] is not g or hit[1] is not scenario:
        tm = group_timing(i, g, scenario, chunk, max_running)
        mu, slots = capacity_and_slots(tm, ln)
        if len(_GROUPS) >= MAX_GROUPS:
            _GROUPS.clear()
        hit = _GROUPS[key] = (g, scenario, (tm, g.count, mu, slots))
    return hit[2]


def _utilisation(per_tier: list[list[Group]], rate: float, visits: list[float]) -> list[float]:
    """Per tier, offered rate over capacity: ``rate * visits[k] / sum(count * mu)`` (inf for load without
    replicas, 0 for neither)."""
    util = []
    for k, groups in enumerate(per_tier):
        cap = sum(c * mu for _, c, mu, _ in groups)
        lam = rate * visits[k]
        util.append(lam / cap if cap > 0 else (math.inf if lam > 0 else 0.0))
    return util


@dataclass(frozen=True)
class _TierColumns:
    """Per tier: the load-weighted time to first token A, per-token time tau, and the slot wait's first
    moment ``w1`` and second moment ``w2`` (0 for a tier without load)."""

    a: list[float]
    tau: list[float]
    w1: list[float]
    w2: list[float]

    def add(self, a: float, tau: float, w1: float, w2: float) -> None:
        self.a.append(a)
        self.tau.append(tau)
        self.w1.append(w1)
        self.w2.append(w2)


#: a tier's terms (:func:`_tier_terms`): its row of the tier columns (A, tau, w1, w2), one mixture component per
#: group, and each group's prefill utilisation
TierTerms = tuple[tuple[float, float, float, float], tuple[Component, ...], tuple[float, ...]]
#: tier terms by their inputs (:func:`_tier_terms_of`), keyed by the groups' timing tables' ids (emptied with them)
_TERMS: dict[tuple, TierTerms] = {}
#: entries before :data:`_TERMS` is emptied (each ~1 KB)
MAX_TERMS = 16384

on_evict(_TERMS.clear)


def _tier_terms_of(
    k: int, groups: list[Group], lam_k: float, rho: float, ln: Lengths, cs2: float, cs2_pf: float, ca2_k: float
) -> TierTerms:
    """:func:`_tier_terms`, remembered: a search's candidate pool holds the axis and swap neighbours of a plan,
    which change one or two groups and leave the other tiers as they were, so most tiers of a pool's plans
    were computed already (a group is its replica type's table and its count; its capacity and slots follow
    from the table and ``ln``)."""
    key = (k, tuple([(id(g[0]), g[1]) for g in groups]), lam_k, rho, ln, cs2, cs2_pf, ca2_k)
    hit = _TERMS.get(key)
    if hit is None:
        if len(_TERMS) >= MAX_TERMS:
            _TERMS.clear()
        hit = _TERMS[key] = _tier_terms(k, groups, lam_k, rho, ln, cs2, cs2_pf, ca2_k)
    return hit


def _tier_terms(
    k: int, groups: list[Group], lam_k: float, rho: float, ln: Lengths, cs2: float, cs2_pf: float, ca2_k: float
) -> TierTerms:
    """Tier k's latency terms at its offered rate ``lam_k`` and utilisation ``rho``: its row of the tier columns,
    one mixture component per group, and each group's prefill utilisation.

    The slot wait is the tier's G/G/c queue (module doc): ``P(wait) = erlang_c(slots, rho)`` times the mean
    wait ``svc / (slots (1 - rho)) (ca^2 + cs^2) / 2``, taken as exponential (second moment ``2 wc^2``)."""
    slots = sum(c * s for _, c, _, s in groups)
    at, shares = balance(groups, lam_k, ln)
    a_sum = tau_sum = svc = 0.0
    # the balancer sends each request to the replica with the fewest outstanding ones, so the tier's
    # prefill stages pool: a prompt waits only when the replicas it could go to are all prefilling
    prefill_rho_k = sum(sh * prho for sh, (_, _, _, _, prho, _, _) in zip(shares, at, strict=True))
    pool = pooling(sum(c for _, c, _, _ in groups), prefill_rho_k)
    prhos = []
    comps: list[Component] = []
    for (_, count, _, _), (a, tau, wvar, svar, prho, wq, start), share in zip(groups, at, shares, strict=True):
        a_sum += share * a
        tau_sum += share * tau
        svc += share * (a + tau * (ln.mean_out - 1))
        # the curves assume Poisson arrivals (M/G/1 prefill stage); Kingman's G/G/1 factor scales the
        # prefill wait and the clustering of the prefills that stall decoding for burstier arrivals. A
        # replica sees the tier's stream thinned to its share p (Whitt: ca2 = 1 + p (ca2_tier - 1)).
        # Pooling shortens the Poisson part of the wait, not the burst excess: a burst reaches every replica
        ca2_rep = 1.0 + (ca2_k - 1.0) * share / count
        gg = (ca2_rep + cs2_pf) / (1.0 + cs2_pf)
        burst = wq * (gg - 1.0)
        # the prompts queued behind a request when its prefill ends were sent to its replica while it was
        # busy: the balancer pools those too (the decode-start wait is that queue's busy period)
        a += (wq + start) * (pool - 1.0) + burst
        wq = wq * pool + burst
        extra_var = (wvar * pool + max(ln.mean_out - 1.0, 0.0) * svar) * gg * gg
        comps.append((k, share, a, tau, wq, extra_var))
        prhos.append(prho)
    p_wait = erlang_c(slots, rho)
    wc = svc / (slots * (1.0 - rho)) * 0.5 * (ca2_k + cs2)
    return (a_sum, tau_sum, p_wait * wc, 2.0 * p_wait * wc * wc), tuple(comps), tuple(prhos)


#: the mixture's components: weights, shifts, means and variances of their gamma-shaped variable parts
Parts = tuple[list[float], list[float], list[float], list[float]]


def _cascade_parts(
    visits: list[float], cols: _TierColumns, lns: Sequence[Lengths], var_k: list[float], judge_delay_s: float
) -> Parts:
    """One component per cascade path (the requests that end at tier j), weighted by its share of requests.

    A path is judged at every hop it passes, and at its own unless it is the last tier (engine.simulate).
    Each hop generates its own tier's answer (tier_stats' lengths); one prompt's answers at two tiers are
    taken as perfectly correlated in length (as when every tier gave the same length), so their decode
    times' standard deviations add."""
    w_l, s_l, m_l, v_l = [], [], [], []
    n = len(cols.a)  # the tiers
    total = max(visits[0], 1e-12)
    for j in range(n):
        ends = visits[j] - (visits[j + 1] if j + 1 < n else 0.0)
        if ends <= 1e-12:
            continue
        a = sum(cols.a[: j + 1]) + (j + (j < n - 1)) * judge_delay_s
        tau = sum(cols.tau[: j + 1])
        w1 = sum(cols.w1[: j + 1])
        w2 = sum(cols.w2[i] - cols.w1[i] ** 2 for i in range(j + 1))
        w_l.append(ends / total)
        s_l.append(a - tau)
        m_l.append(sum(cols.tau[i] * lns[i].mean_out for i in range(j + 1)) + w1)
        v_l.append(sum(cols.tau[i] * math.sqrt(var_k[i]) for i in range(j + 1)) ** 2 + w2)
    return w_l, s_l, m_l, v_l


def _preroute_parts(
    visits: list[float], cols: _TierColumns, lns: Sequence[Lengths], var_k: list[float], comps: list[Component]
) -> Parts:
    """One component per replica group, weighted by its share of all requests. The prefill-stage wait is
    random: it joins the gamma-shaped variable part, not the shift."""
    w_l, s_l, m_l, v_l = [], [], [], []
    for k, share, a, tau, wq, extra_var in comps:
        w_l.append(visits[k] * share)
        s_l.append(a - wq - tau)
        m_l.append(tau * lns[k].mean_out + cols.w1[k] + wq)
        v_l.append(tau * tau * var_k[k] + cols.w2[k] - cols.w1[k] ** 2 + extra_var)
    return w_l, s_l, m_l, v_l


def _mixture(w_l: list[float], s_l: list[float], m_l: list[float], v_l: list[float]) -> tuple[float, float, float]:
    """(P50, P95, mean) of the weighted mixture of shifted gammas, each moment-matched to its mean m and
    variance v: shape ``m^2 / v``, scale ``v / m``."""
    w = np.asarray(w_l)
    shift = np.asarray(s_l)
    m = np.maximum(np.asarray(m_l), 1e-9)
    v = np.maximum(np.asarray(v_l), 1e-12)
    shape = m * m / v
    scale = v / m
    p50, p95 = mixture_quantiles(w, shift, shape, scale, (0.5, 0.95))
    mean = float((w * (shift + m)).sum() / w.sum())
    return p50, p95, mean
