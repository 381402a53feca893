"""Request streams for the simulator and the optimiser: arrival times plus prompt/output token lengths.

``build_workload(scenario)`` turns a scenario's ``workload:`` section into numpy arrays; everything is
drawn from ``numpy.random.default_rng`` seeded by the scenario (or the ``seed`` argument), with
independent streams for arrivals and lengths, so a fixed seed gives the same workload every time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boute.data import data_path
from boute.specs.scenario import Scenario
from boute.workload.arrivals import read_trace, renewal_arrivals, trace_arrivals
from boute.workload.prefixes import Prefixes, RecordedTurns, draw_prefixes
from boute.workload.profiles import ProfileLengths, profile_lengths


@dataclass(frozen=True)
class Workload:
    arrival_s: np.ndarray  # float64, sorted, seconds from 0
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    prompt_index: np.ndarray  # int64 row of the quality profile (lengths.source == "profile"), else -1
    rate_rps: float
    duration_s: float
    #: int64 (requests, tiers): the answer length tier k gives request i, where the profile records every
    #: tier's responses (:mod:`boute.workload.profiles`); None: every tier answers ``output_tokens``
    tier_output_tokens: np.ndarray | None = None
    #: what the prompts share (system prompts, earlier turns) for the prefix cache; None: nothing
    prefixes: Prefixes | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    def output_at(self, tier: np.ndarray | int) -> np.ndarray:
        """Answer length of each request when tier ``tier`` (an index, or one per request) answers it."""
        if self.tier_output_tokens is None:
            return self.output_tokens
        k = np.broadcast_to(np.asarray(tier, dtype=np.int64), self.output_tokens.shape)
        return self.tier_output_tokens[np.arange(len(k)), k]


@dataclass(frozen=True)
class WorkloadStats:
    """The moments the analytical fast path needs (cheap to pass around, hashable)."""

    rate_rps: float
    arrival_cv: float
    mean_input: float
    mean_output: float
    input_sq_mean: float
    output_sq_mean: float
    p95_output: float


def _profile(scenario: Scenario) -> ProfileLengths:
    base = scenario.source.parent if scenario.source is not None else None
    models = tuple(t.quality_model or t.name for t in scenario.tiers)
    return profile_lengths(scenario.quality.profile, scenario.quality.format, models, base)


def _row_weights(scenario: Scenario) -> np.ndarray | None:
    """Weight of each profile prompt in the scenario's ``workload.mix`` (None: the profile's own mix). The
    mix is over router scores, which the quality model holds."""
    if scenario.workload.mix is None:
        return None
    from boute.quality import quality_model_for

    return quality_model_for(scenario).row_weights


def profile_mean_lengths(scenario: Scenario) -> tuple[float, float] | None:
    """Mean prompt and answer tokens per request of a profile workload in the scenario's mix, before the
    ``lengths`` scales (None for other length sources): how much a change of mix alone moves the lengths."""
    if scenario.workload.lengths.source != "profile":
        return None
    prof = _profile(scenario)
    w = _row_weights(scenario)
    return float(np.average(prof.input_tokens, weights=w)), float(np.average(prof.output_tokens, weights=w))


def _scaled(x: np.ndarray, scale: float, cap: int) -> np.ndarray:
    """Token lengths times the scenario's scale, rounded, in ``[1, cap]``."""
    return np.clip(np.rint(np.asarray(x, dtype=float) * scale), 1, cap).astype(np.int64)


@dataclass(frozen=True)
class _RowLengths:
    """A profile's lengths per row, scaled as the scenario's ``lengths`` say: what a request asking that row
    prefills (``input``), answers (``output``, ``per_tier``) and, as a recorded conversation's next turn,
    adds to the conversation (``own``)."""

    input: np.ndarray
    output: np.ndarray
    per_tier: np.ndarray | None
    own: np.ndarray
    next_turn: np.ndarray | None

    @classmethod
    def of(cls, scenario: Scenario) -> _RowLengths:
        spec, prof = scenario.workload.lengths, _profile(scenario)
        in_scale, out_scale = spec.scale * spec.input_scale, spec.scale * spec.output_scale
        own = prof.input_tokens if prof.own_input_tokens is None else prof.own_input_tokens
        per_tier = prof.tier_output_tokens
        return cls(
            _scaled(prof.input_tokens, in_scale, spec.max_input),
            _scaled(prof.output_tokens, out_scale, spec.max_output),
            None if per_tier is None else _scaled(per_tier, out_scale, spec.max_output),
            _scaled(own, in_scale, spec.max_input),
            prof.next_turn,
        )


def _draw_rows(scenario: Scenario, n: int, rng: np.random.Generator, pool: np.ndarray) -> np.ndarray:
    """``n`` profile rows drawn with replacement from ``pool``, uniformly or in the scenario's ``workload.mix``."""
    w = _row_weights(scenario)
    if w is None:
        return pool[rng.integers(0, len(pool), n)].astype(np.int64)
    wp = w[pool]  # prompts drawn in the scenario's difficulty mix
    return pool[rng.choice(len(pool), size=n, p=wp / wp.sum())].astype(np.int64)


def _recorded_turns(scenario: Scenario, rl: _RowLengths, pool: np.ndarray) -> RecordedTurns | None:
    """The profile's recorded next turns among ``pool``, where the scenario's conversations should ask them
    (``workload.prefixes.conversations`` over a profile that records conversations, MT-Bench's two turns);
    else None."""
    pre = scenario.workload.prefixes
    if pre is None or pre.conversations is None or rl.next_turn is None:
        return None
    nxt = np.where(np.isin(rl.next_turn, pool), rl.next_turn, -1)  # a next turn outside the pool is not asked
    return RecordedTurns(nxt, rl.own, rl.output)


def _lengths(
    scenario: Scenario,
    n: int,
    trace_rows: np.ndarray | None,
    rng: np.random.Generator,
    rows: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, _RowLengths | None, RecordedTurns | None]:
    """Each request's prompt and answer tokens, its profile row (-1 none), the profile's per-row lengths (None
    for other length sources) and its recorded next turns (None: none asked)."""
    spec = scenario.workload.lengths
    base = scenario.source.parent if scenario.source is not None else None
    if spec.source == "profile":
        rl = _RowLengths.of(scenario)
        pool = np.arange(len(rl.input)) if rows is None else np.asarray(rows, dtype=np.int64)
        if pool.size == 0 or pool.min() < 0 or pool.max() >= len(rl.input):
            raise ValueError(f"rows must be non-empty profile rows in [0, {len(rl.input)})")
        turns = _recorded_turns(scenario, rl, pool)
        if turns is not None and rl.next_turn is not None:  # conversations open on first turns (module doc)
            firsts = pool[~np.isin(pool, rl.next_turn)]
            pool = firsts if firsts.size else pool
        pidx = _draw_rows(scenario, n, rng, pool)
        return rl.input[pidx], rl.output[pidx], pidx, rl, turns
    if spec.source == "trace":
        trace = read_trace(data_path(scenario.workload.arrivals.trace, base))
        rows = trace_rows if trace_rows is not None else rng.integers(0, len(trace.context_tokens), n)
        rows = rows % len(trace.context_tokens)
        inp, out = trace.context_tokens[rows], trace.generated_tokens[rows]
    elif spec.source == "fixed":
        inp = np.full(n, spec.input_tokens)
        out = np.full(n, spec.output_tokens)
    else:  # lognormal with the given means: mu = ln(mean) - sigma^2 / 2
        s = spec.sigma
        inp = rng.lognormal(np.log(spec.input_tokens) - s * s / 2, s, n)
        out = rng.lognormal(np.log(spec.output_tokens) - s * s / 2, s, n)
    return (
        _scaled(inp, spec.scale * spec.input_scale, spec.max_input),
        _scaled(out, spec.scale * spec.output_scale, spec.max_output),
        np.full(n, -1, dtype=np.int64),
        None,
        None,
    )


def build_workload(
    scenario: Scenario,
    *,
    rate_rps: float | None = None,
    duration_s: float | None = None,
    seed: int | None = None,
    rows: np.ndarray | None = None,
) -> Workload:
    """The scenario's request stream over ``duration_s`` at ``rate_rps`` (defaults from the scenario).

    Trace arrivals replay the trace scaled to the rate (see :mod:`boute.workload.arrivals`); with
    ``lengths.source == "trace"`` each arrival keeps its own trace row's lengths. Profile lengths sample
    prompts with replacement (uniformly, or in the scenario's ``workload.mix``) from the profile rows
    ``rows`` (default: all) and record the row in ``prompt_index``; where the scenario's conversations run over
    a profile that records them (MT-Bench), conversations open on first turns and a later turn asks its
    conversation's recorded next question (:func:`boute.workload.prefixes.draw_prefixes`), with that question's
    own answer lengths. The evaluators and ``boute verify``
    pass the quality model's held-out rows (:func:`replay_workload`), so a plan's latency is predicted
    and measured on one request stream routed as unseen prompts are.
    """
    wl = scenario.workload
    rate = float(rate_rps if rate_rps is not None else wl.rate_rps)
    duration = float(duration_s if duration_s is not None else wl.duration_s)
    if not (rate > 0 and duration > 0):
        raise ValueError(f"rate_rps and duration_s must be > 0, got {rate} and {duration}")
    seq = np.random.SeedSequence(wl.seed if seed is None else seed)
    # a third stream for prefixes: spawn(3)'s first two children are spawn(2)'s, so workloads without
    # prefixes are drawn exactly as before
    rng_arrivals, rng_lengths, rng_prefixes = (np.random.default_rng(s) for s in seq.spawn(3))
    base = scenario.source.parent if scenario.source is not None else None
    trace_rows = None
    if wl.arrivals.kind == "trace":
        arrivals, trace_rows = trace_arrivals(read_trace(data_path(wl.arrivals.trace, base)), rate, duration)
    else:
        arrivals = renewal_arrivals(wl.arrivals.kind, rate, duration, wl.arrivals.cv, rng_arrivals)
    inp, out, pidx, rl, turns = _lengths(scenario, len(arrivals), trace_rows, rng_lengths, rows)
    prefixes = None
    if wl.prefixes is not None:  # the drawn prompt becomes each request's new text after what it shares
        prefixes, inp, asked = draw_prefixes(
            wl.prefixes, arrivals, inp, out, wl.lengths.max_input, rng_prefixes, pidx, turns
        )
        if turns is not None:  # recorded next turns asked: their own answers' lengths
            pidx, out = asked, turns.answer_tokens[asked]
    per_tier = None if rl is None or rl.per_tier is None else rl.per_tier[pidx]
    return Workload(arrivals.astype(np.float64), inp, out, pidx, rate, duration, per_tier, prefixes)


def replay_workload(
    scenario: Scenario,
    held_out: np.ndarray,
    *,
    rate_rps: float | None = None,
    duration_s: float | None = None,
    seed: int | None = None,
) -> Workload:
    """The request stream a plan is judged on: the scenario's arrivals carrying the quality model's
    held-out prompts (``QualityModel.test_index``), the ones its promised quality and tier shares were
    computed on. The simulator, the fast path and ``boute verify`` all replay it, so the latency promise
    and its check see the same prompts routed the same way. Why not every profile row: the router and the
    cascade verifier were trained on the rest, and route their own training prompts differently from
    unseen ones (MT-Bench cascade: 11.3% escalated over all rows, 8.3% held out, which moved the simulated
    P95 from 9.4 s to 21 s on a plan whose large tier ran near saturation)."""
    return build_workload(scenario, rate_rps=rate_rps, duration_s=duration_s, seed=seed, rows=held_out)


def _stats(rate: float, cv: float, input_tokens: np.ndarray, output_tokens: np.ndarray) -> WorkloadStats:
    inp = input_tokens.astype(float)
    out = output_tokens.astype(float)
    return WorkloadStats(
        rate_rps=float(rate),
        arrival_cv=cv,
        mean_input=float(inp.mean()),
        mean_output=float(out.mean()),
        input_sq_mean=float((inp * inp).mean()),
        output_sq_mean=float((out * out).mean()),
        p95_output=float(np.percentile(out, 95)),
    )


def workload_stats(w: Workload) -> WorkloadStats:
    """Rate, arrival burstiness and length moments of a workload.

    The rate is the workload's own, requests over the horizon, not the nominal ``w.rate_rps``: a replayed
    trace window carries the trace's local rate (the built-in 60 s window offers ~89 req/s at a nominal
    100), and that is what a simulation of it serves. On random scenarios with trace arrivals the nominal
    rate left the fast path up to ~2.7x pessimistic where the window ran 16% light, and optimistic where it
    ran heavy (docs/simulator.md)."""
    gaps = np.diff(w.arrival_s)
    cv = float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else 1.0
    rate = len(w) / w.duration_s if len(w) and w.duration_s > 0 else w.rate_rps
    return _stats(rate, cv, w.input_tokens, w.output_tokens)


def tier_workload_stats(w: Workload, route: np.ndarray | None, n_tiers: int) -> list[WorkloadStats]:
    """The length moments of the requests each tier serves, each with the whole stream's rate and arrival
    cv, and its answers at that tier's own length (:meth:`Workload.output_at`): the fast path's
    ``tier_stats``. ``route[i]`` is request i's tier (routing by difficulty sorts prompts by length too, so
    the tiers' shapes differ); ``None`` (a cascade, or no router at hand): every tier sees every prompt. A
    tier that gets no request has the whole stream's prompts."""
    whole = workload_stats(w)
    if route is not None:
        route = np.asarray(route)
        if route.shape != (len(w),):
            raise ValueError(f"route must hold one tier per request ({len(w)}), got shape {route.shape}")
    out = []
    for k in range(n_tiers):
        m = np.ones(len(w), dtype=bool) if route is None else route == k
        if not m.any():
            m = np.ones(len(w), dtype=bool)
        out.append(_stats(whole.rate_rps, whole.arrival_cv, w.input_tokens[m], w.output_at(k)[m]))
    return out


__all__ = [
    "Prefixes",
    "Workload",
    "WorkloadStats",
    "build_workload",
    "replay_workload",
    "tier_workload_stats",
    "workload_stats",
]
