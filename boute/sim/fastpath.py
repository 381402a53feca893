"""Analytical fast path: a queueing approximation of a plan, ~thousands of evaluations per second.

Per replica group (see :mod:`boute.sim.capacity`): the capacity ``mu`` (req/s) at the KV-limited batch,
and at the offered load the mean decode batch, step time ``step`` and prefill share ``phi`` (Little's law
fixed point). The balancer loads replicas in proportion to capacity, so every replica of a tier runs at
the tier's utilisation ``rho = lambda_tier / sum(mu)``.

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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import gammainc

from boute.catalog import Catalog
from boute.errors import InfeasibleError
from boute.perf import replica_perf, scenario_catalog
from boute.sim.capacity import Lengths, OperatingPoint, capacity_rps, kv_batch, operating_point, prefill_queue
from boute.sim.confidence import BASE_BAND, Confidence, assess, needs_confirmation
from boute.sim.engine import JUDGE_DELAY_S, group_label, plan_cost
from boute.sim.timing import DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_RUNNING, ReplicaTiming, build_timing
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


# ---- caches: the optimiser calls us thousands of times with the same scenario and few replica types ----
_CATALOGS: dict[int, tuple[Scenario, Catalog]] = {}
#: (catalog, timing or why the replica does not fit): the value keeps the catalog alive, so its id in the key
#: cannot be reused by another catalog while the entry lives
_TIMINGS: dict[tuple, tuple[Catalog, ReplicaTiming | str]] = {}
_CAPS: dict[tuple, tuple[float, int]] = {}
#: replica types kept before every cache is emptied: a timing table holds ~2 MB (one optimisation uses a few
#: dozen types; a benchmark over hundreds of scenarios would otherwise grow by ~70 MB per scenario)
MAX_TIMINGS = 192


def _forget() -> None:
    """Empty the caches keyed by a timing's id together with the timings: a freed timing's id may be reused."""
    _TIMINGS.clear()
    _CAPS.clear()
    _LOAD.clear()
    _TIER.clear()


def _timing(i: int, g: ReplicaGroup, scenario: Scenario, chunk: int, max_running: int) -> ReplicaTiming:
    entry = _CATALOGS.get(id(scenario))
    if entry is None or entry[0] is not scenario:
        if len(_CATALOGS) > 16:
            _CATALOGS.clear()
        entry = (scenario, scenario_catalog(scenario))
        _CATALOGS[id(scenario)] = entry
    cat = entry[1]
    key = (id(cat), g.model, g.gpu, g.tp, g.pp, g.dtype, chunk, max_running)
    hit = _TIMINGS.get(key)
    if hit is None:
        perf = replica_perf(cat.model(g.model), cat.gpu(g.gpu), tp=g.tp, pp=g.pp, dtype=g.dtype)
        if len(_TIMINGS) >= MAX_TIMINGS:
            _forget()
        hit = _TIMINGS[key] = (cat, build_timing(perf, chunk, max_running) if perf.fits else perf.reason)
    tm = hit[1]
    if isinstance(tm, str):
        raise InfeasibleError(f"{group_label(i, g)} cannot serve its model: {tm}")
    return tm


def _capacity(tm: ReplicaTiming, ln: Lengths) -> tuple[float, int]:
    key = (id(tm), ln)
    hit = _CAPS.get(key)
    if hit is None:
        if len(_CAPS) > 65536:
            _CAPS.clear()
        hit = _CAPS[key] = (capacity_rps(tm, ln), kv_batch(tm, ln))
    return hit


def _pooling(c: int, rho: float) -> float:
    """Mean wait of an M/M/c queue over that of c separate M/M/1 queues at the same utilisation:
    ``C(c, rho) / (c rho)`` (Erlang C), 1 for one server. How much joining the least-loaded of ``c``
    replicas shortens the prefill-stage wait; exact for small ``c``, where the Halfin-Whitt form is not."""
    if c <= 1 or rho <= 0:
        return 1.0
    rho = min(rho, 0.999)
    a = c * rho
    term = total = 1.0
    for k in range(1, c):
        term *= a / k
        total += term
    last = term * a / c / (1.0 - rho)
    return (last / (total + last)) / (c * rho)


def _erlang_c(c: float, rho: float) -> float:
    """P(wait) in an M/M/c queue, Halfin-Whitt approximation (good for the large c of batch slots)."""
    beta = (1.0 - rho) * math.sqrt(c)
    if beta <= 0:
        return 1.0
    if beta > 30.0:
        return 0.0
    phi = math.exp(-0.5 * beta * beta) / math.sqrt(2 * math.pi)
    big_phi = 0.5 * (1.0 + math.erf(beta / math.sqrt(2.0)))
    return min(1.0, 1.0 / (1.0 + beta * big_phi / phi))


_COARSE = np.linspace(0.0, 1.0, 96)
_FINE = np.linspace(0.0, 1.0, 24)


def _mix_cdf(w: np.ndarray, shift: np.ndarray, shape: np.ndarray, scale: np.ndarray, x: np.ndarray) -> np.ndarray:
    z = np.maximum(x[..., None] - shift, 0.0) / scale
    return (gammainc(shape, z) * w).sum(-1)


def mixture_quantiles(
    w: np.ndarray, shift: np.ndarray, shape: np.ndarray, scale: np.ndarray, qs: Sequence[float]
) -> list[float]:
    """Quantiles of sum_i w_i * (shift_i + Gamma(shape_i, scale_i)): a coarse grid, then one refinement."""
    w = w / w.sum()
    q = np.asarray(qs, dtype=float)
    lo = float(shift.min())
    hi = float(np.max(shift + shape * scale + 12.0 * np.sqrt(shape) * scale))
    x = lo + (hi - lo) * _COARSE
    cdf = _mix_cdf(w, shift, shape, scale, x)
    j = np.clip(np.searchsorted(cdf, q), 1, len(x) - 1)
    fine = x[j - 1][:, None] + (x[j] - x[j - 1])[:, None] * _FINE[None, :]
    cdf2 = _mix_cdf(w, shift, shape, scale, fine)
    out = []
    for i, qi in enumerate(q):
        xs, cs = fine[i], cdf2[i]
        out.append(float(np.interp(qi, cs, xs)))
    return out


_RHO_GRID = (0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.87, 0.93, 0.97, 0.985, 0.995)
_LOAD: dict[tuple, tuple[list[float], ...]] = {}


def _residence(op: OperatingPoint, mean_out: float) -> float:
    return 0.5 * op.step_s + op.prefill_s + op.step_s / max(1e-9, 1.0 - op.prefill_share) * (mean_out - 1)


def _load_curve(tm: ReplicaTiming, mu: float, ln: Lengths) -> tuple[list[float], ...]:
    """One replica over a grid of rates up to its capacity (cached per replica type and lengths):
    outstanding requests (rate x residence, Little), rate, time to first token A (with the wait for the
    prefill stage), per-token time tau, the prefill wait's variance, the decode-stall variance per token
    and the prefill stage's utilisation. Evaluations interpolate in it instead of re-solving."""
    key = (id(tm), ln)
    hit = _LOAD.get(key)
    if hit is None:
        lams = [r * mu for r in _RHO_GRID]
        ops = [operating_point(tm, x, ln) for x in lams]
        pqs = [prefill_queue(tm, x, ln, op) for x, op in zip(lams, ops, strict=True)]
        outs = [
            x * (_residence(op, ln.mean_out) + q.wait_mean + q.decode_start_wait)
            for x, op, q in zip(lams, ops, pqs, strict=True)
        ]
        for i in range(1, len(outs)):  # guard monotonicity against approximation wiggles
            outs[i] = max(outs[i], outs[i - 1] + 1e-9)
        a = [0.5 * op.step_s + op.prefill_s + q.wait_mean + q.decode_start_wait for op, q in zip(ops, pqs, strict=True)]
        tau = [op.step_s / max(1e-9, 1.0 - op.prefill_share) for op in ops]
        if len(_LOAD) > 65536:
            _LOAD.clear()
        hit = _LOAD[key] = (
            outs,
            lams,
            a,
            tau,
            [q.wait_var for q in pqs],
            [q.stall_var_per_token for q in pqs],
            [q.work_rho for q in pqs],
            [q.wait_mean for q in pqs],
            [q.decode_start_wait for q in pqs],
        )
    return hit


_TIER: dict[tuple, tuple[np.ndarray, np.ndarray, list]] = {}
_TIER_GRID = 1024


def _tier_curve(counts: np.ndarray, mus: np.ndarray, curves: list) -> tuple[np.ndarray, np.ndarray]:
    """The tier's total rate at each balancing level c on a fine grid, cached per replica mix.

    It depends only on the groups (not on the offered rate), and the optimiser revisits the same mixes
    at many rates, so each call of :func:`_balance` is then one interpolation instead of a grid search.
    The rate is piecewise linear and non-decreasing in c, so linear interpolation on the grid is close;
    the caller rescales the group rates to add up exactly.
    """
    key = tuple((float(n), float(mu), id(cv)) for n, mu, cv in zip(counts, mus, curves, strict=True))
    hit = _TIER.get(key)
    if hit is None:
        hi = float(max((cv[0][-1] + 1.0) / mu for mu, cv in zip(mus, curves, strict=True)))
        cs = np.linspace(0.0, hi, _TIER_GRID)
        tot = sum(n * np.interp(cs * mu - 1.0, cv[0], cv[1]) for n, mu, cv in zip(counts, mus, curves, strict=True))
        tot = np.maximum.accumulate(np.asarray(tot, dtype=float))
        if len(_TIER) > 16384:
            _TIER.clear()
        hit = _TIER[key] = (cs, tot, curves)  # keeps the curves alive, so their ids stay unique
    return hit[0], hit[1]


def _at(cv: tuple[list[float], ...], lam: float) -> tuple[float, ...]:
    """(A, tau, wait variance, stall variance per token, prefill utilisation, mean prefill wait, decode-start
    wait) at ``lam``."""
    return tuple(float(np.interp(lam, cv[1], cv[k])) for k in (2, 3, 4, 5, 6, 7, 8))


def _balance(
    groups: list[tuple[ReplicaTiming, int, float, int]], lam: float, ln: Lengths
) -> tuple[list[tuple[float, ...]], list[float]]:
    """(A, tau, variances, prefill utilisation) and request share of each group under least-outstanding, capacity-weighted balancing.

    The balancer equalises (outstanding + 1) / capacity across replicas, and outstanding = rate x
    residence (Little), so at a common level ``c`` each replica holds ``c * mu_g - 1`` requests; its rate
    follows from its (cached, monotone) outstanding-vs-rate curve, and ``c`` is read off the tier's cached
    rate-vs-level curve so the rates add up to the tier's. Slow replicas hold requests longer and so get less than their
    capacity share at light load.
    """
    total_cap = sum(n * mu for _, n, mu, _ in groups)
    curves = [_load_curve(tm, mu, ln) for tm, _, mu, _ in groups]
    if len(groups) == 1:
        _, n, _, _ = groups[0]
        cv = curves[0]
        return [_at(cv, lam / n)], [1.0]
    mus = np.array([mu for _, _, mu, _ in groups])
    counts = np.array([n for _, n, _, _ in groups], dtype=float)
    cs, tot = _tier_curve(counts, mus, curves)
    c = float(np.interp(lam, tot, cs))
    lams = [float(np.interp(c * mu - 1.0, cv[0], cv[1])) for mu, cv in zip(mus, curves, strict=True)]
    got = sum(n * x for n, x in zip(counts, lams, strict=True))
    if float(tot[-1]) < lam or got <= 0:
        # beyond the curves, or a load so light that the level falls inside the grid's first cell (no replica
        # holds a request yet): capacity-proportional
        lams = [lam * mu / total_cap for _, _, mu, _ in groups]
    else:
        lams = [x * lam / got for x in lams]
    at = [_at(cv, x) for x, cv in zip(lams, curves, strict=True)]
    return at, [n * x / lam for (_, n, _, _), x in zip(groups, lams, strict=True)]


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
    per_tier: list[list[tuple[ReplicaTiming, int, float, int]]] = [[] for _ in tiers]
    for i, g in enumerate(deployment):
        if g.tier not in tiers:
            continue
        k = tiers.index(g.tier)
        tm = _timing(i, g, scenario, chunk_tokens, max_running)
        mu, slots = _capacity(tm, lns[k])
        per_tier[k].append((tm, g.count, mu, slots))
    util = []
    for k, groups in enumerate(per_tier):
        cap = sum(c * mu for _, c, mu, _ in groups)
        lam = rate * visits[k]
        util.append(lam / cap if cap > 0 else (math.inf if lam > 0 else 0.0))
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
    tier_a: list[float] = []
    tier_tau: list[float] = []
    tier_w1: list[float] = []
    tier_w2: list[float] = []
    comps: list[tuple[int, float, float, float, float, float]] = []
    prefill_rho = 0.0
    for k, groups in enumerate(per_tier):
        lam_k = rate * visits[k]
        if lam_k <= 0 or not groups:
            for column in (tier_a, tier_tau, tier_w1, tier_w2):
                column.append(0.0)
            continue
        rho = util[k]
        slots = sum(c * s for _, c, _, s in groups)
        ln = lns[k]
        cs2, cs2_pf = cs2_k[k], cs2_pf_k[k]
        at, shares = _balance(groups, lam_k, ln)
        ca2_k = 1.0 + visits[k] * (ca2 - 1.0) if mode == "preroute" else ca2
        a_sum = tau_sum = svc = 0.0
        # the balancer sends each request to the replica with the fewest outstanding ones, so the tier's
        # prefill stages pool: a prompt waits only when the replicas it could go to are all prefilling
        prefill_rho_k = sum(sh * prho for sh, (_, _, _, _, prho, _, _) in zip(shares, at, strict=True))
        pool = _pooling(sum(c for _, c, _, _ in groups), prefill_rho_k)
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
            prefill_rho = max(prefill_rho, prho)
        p_wait = _erlang_c(slots, rho)
        wc = svc / (slots * (1.0 - rho)) * 0.5 * (ca2_k + cs2)
        tier_a.append(a_sum)
        tier_tau.append(tau_sum)
        tier_w1.append(p_wait * wc)
        tier_w2.append(2.0 * p_wait * wc * wc)

    w_l, s_l, m_l, v_l = [], [], [], []
    if mode == "cascade":
        total = max(visits[0], 1e-12)
        for j in range(len(tiers)):
            ends = visits[j] - (visits[j + 1] if j + 1 < len(tiers) else 0.0)
            if ends <= 1e-12:
                continue
            # judged at every hop it passes, and at its own unless it is the last tier (engine.simulate)
            # each hop generates its own tier's answer (tier_stats' lengths); one prompt's answers at two tiers
            # are taken as perfectly correlated in length (as when every tier gave the same length), so their
            # decode times' standard deviations add
            a = sum(tier_a[: j + 1]) + (j + (j < len(tiers) - 1)) * judge_delay_s
            tau = sum(tier_tau[: j + 1])
            w1 = sum(tier_w1[: j + 1])
            w2 = sum(tier_w2[i] - tier_w1[i] ** 2 for i in range(j + 1))
            w_l.append(ends / total)
            s_l.append(a - tau)
            m_l.append(sum(tier_tau[i] * lns[i].mean_out for i in range(j + 1)) + w1)
            v_l.append(sum(tier_tau[i] * math.sqrt(var_k[i]) for i in range(j + 1)) ** 2 + w2)
    else:
        for k, share, a, tau, wq, extra_var in comps:
            # the prefill-stage wait is random: it joins the gamma-shaped variable part, not the shift
            w_l.append(visits[k] * share)
            s_l.append(a - wq - tau)
            m_l.append(tau * lns[k].mean_out + tier_w1[k] + wq)
            v_l.append(tau * tau * var_k[k] + tier_w2[k] - tier_w1[k] ** 2 + extra_var)
    w = np.asarray(w_l)
    shift = np.asarray(s_l)
    m = np.maximum(np.asarray(m_l), 1e-9)
    v = np.maximum(np.asarray(v_l), 1e-12)
    shape = m * m / v
    scale = v / m
    p50, p95 = mixture_quantiles(w, shift, shape, scale, (0.5, 0.95))
    mean = float((w * (shift + m)).sum() / w.sum())
    conf = assess(worst, prefill_rho, stats.arrival_cv, True)
    return FastResult(p95, p50, mean, rate, capacity, tuple(util), True, cost, conf, prefill_rho)
