"""Seeded random serving scenarios: shapes nobody picked, for benchmarks of the evaluators and the optimiser.

``random_scenario(seed)`` is a pure function of ``seed`` (no global state, no files written): the same seed
gives the same :class:`~boute.specs.scenario.Scenario` on every machine. ``draw_scenario(seed)`` returns it
with what was drawn (length shape, arrival process, load fraction, capacity estimate), which benchmarks use
to break their figures down. Everything is drawn from real parts the project ships:

* **hardware**: 2-4 GPU types of the catalog (``boute/catalog/gpus.yaml``), 2-16 of each, each price the
  catalog's times a lognormal factor (sigma 0.2, clipped to 0.6-1.6);
* **tiers**: 2-4 catalog models of strictly increasing size (each at least 1.5x the previous one's
  parameters), bf16 (fp8 with probability 0.15); the last tier is scored as the profile's strong model,
  the others as its weak one (the profiles hold two models);
* **lengths** (:data:`SHAPES`): the Azure conversation trace's own ContextTokens/GeneratedTokens, rescaled
  into conversation, retrieval (long prompt, medium answer), code-completion (long prompt, answers of
  ~10-60 tokens: prefill-heavy) and decode-heavy shapes, or the GSM8K / MT-Bench prompts of the RouteLLM
  profiles with their recorded answers, rescaled;
* **arrivals**: Poisson (smooth), gamma renewals with cv 1.5-3, or the trace's own replayed arrivals (bursty);
* **load**: the rate is a uniform 20-95% of :func:`capacity_estimate`, the largest rate a greedy
  deployment within the budget and inventory sustains (``boute.sim.capacity`` per replica) when the tiers
  share the load as the quality floor needs;
* **targets**: the quality floor a uniform 0-50% of the way from the weak model's profile quality to the
  strong one's; the P95 cap 2-10x (log-uniform) the idle latency of a P95-long answer on the fastest
  replica of the largest tier; the budget a 25-80% share of the inventory's price, raised until every
  tier can buy a replica and the strong tier's share of the load is affordable (never above the
  inventory's price, where it would not bind).

A draw the hardware cannot serve (a tier fits no GPU type within the budget) is redrawn from the same
stream, so every seed gives a valid scenario. The horizon is 60-1,800 s: at least 6,000 requests and 20 P95
caps (to reach a steady state), at most 60,000 requests past the first minute.

It lives with the benchmarks (its users, with the tests), not in the core's ``boute/scenarios``: it draws
on the optimiser's search space and the simulator's capacity, and ``boute/scenarios`` is a data package
low in the core's layers (pyproject.toml's layer contract) that the specs read built-in scenarios from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from boute.errors import InfeasibleError
from boute.specs.scenario import Scenario

#: models a tier may run (max context >= 32k), by parameter count; a scenario's tiers are an increasing chain
MODELS: tuple[str, ...] = (
    "llama-3.2-1b",
    "llama-3.2-3b",
    "mistral-7b",
    "qwen2.5-7b",
    "llama-3.1-8b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "mixtral-8x7b",
    "llama-3.1-70b",
    "qwen2.5-72b",
)
#: the profiles' weak and strong models (both profiles hold these two)
WEAK, STRONG = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
#: length shape -> (probability, length source, input-scale range, output-scale range); scales are drawn
#: log-uniformly. Trace means: 1,155 prompt / 211 answer tokens; GSM8K 56 / 114; MT-Bench 219 / 382.
SHAPES: dict[str, tuple[float, str, tuple[float, float], tuple[float, float]]] = {
    "conversation": (0.20, "trace", (0.5, 1.5), (0.5, 1.5)),
    "retrieval": (0.15, "trace", (1.5, 3.0), (0.3, 0.8)),
    "code-completion": (0.25, "trace", (1.2, 3.5), (0.05, 0.25)),
    "decode-heavy": (0.15, "trace", (0.05, 0.3), (1.5, 4.0)),
    "gsm8k": (0.15, "builtin:gsm8k", (0.5, 4.0), (0.5, 2.0)),
    "mt-bench": (0.10, "builtin:mt-bench", (0.5, 2.0), (0.5, 1.5)),
}
#: arrival process -> probability (gamma: cv drawn in GAMMA_CV)
ARRIVALS: dict[str, float] = {"poisson": 0.4, "gamma": 0.3, "trace": 0.3}
GAMMA_CV = (1.5, 3.0)
LOAD_RANGE = (0.20, 0.95)
#: the horizon: at least MIN_REQUESTS requests and CAP_HORIZONS times the P95 cap (a simulation must reach
#: its steady state: at 20 s, plans with P95s near 20 s were still filling up), at most MAX_REQUESTS
#: requests beyond the first HORIZON_S[0] seconds, within HORIZON_S
MIN_REQUESTS = 6000
MAX_REQUESTS = 60000
CAP_HORIZONS = 20.0
HORIZON_S = (60.0, 1800.0)
MAX_INPUT = 8192


@dataclass(frozen=True)
class ScenarioDraw:
    """A random scenario and what was drawn for it."""

    seed: int
    scenario: Scenario
    shape: str  # key of SHAPES
    arrivals: str  # "poisson", "gamma" or "trace"
    arrival_cv: float  # the gamma cv drawn (1 for Poisson; the trace's own ~1.1 is measured, not drawn)
    load: float  # rate / capacity estimate
    capacity_rps: float  # capacity_estimate at the drawn split
    mean_input: float  # token moments of the scenario's workload
    mean_output: float

    @property
    def bursty(self) -> bool:
        """Gamma or trace arrivals (the trace's minute-scale rate swings count as bursts)."""
        return self.arrivals != "poisson"

    @property
    def prefill_heavy(self) -> bool:
        """Prompts at least 10x the answers and 500 tokens long: prefill sets the replicas' time."""
        return self.mean_input >= 10.0 * self.mean_output and self.mean_input >= 500.0


def random_scenario(seed: int) -> Scenario:
    """A valid random serving scenario, a pure function of ``seed`` (module doc)."""
    return draw_scenario(seed).scenario


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _pick(rng: np.random.Generator, table: dict[str, Any]) -> str:
    names = list(table)
    p = np.array([v[0] if isinstance(v, tuple) else v for v in table.values()], dtype=float)
    return str(names[int(rng.choice(len(names), p=p / p.sum()))])


def _tiers(rng: np.random.Generator, catalog_params: dict[str, float]) -> list[str]:
    n = int(rng.integers(2, 5))
    while True:
        chain = sorted(rng.choice(len(MODELS), size=n, replace=False).tolist(), key=lambda i: catalog_params[MODELS[i]])
        sizes = [catalog_params[MODELS[i]] for i in chain]
        if all(b >= 1.5 * a for a, b in zip(sizes, sizes[1:], strict=False)):
            return [MODELS[i] for i in chain]


def _profile_quality(profile: str) -> tuple[float, float]:
    """The weak and strong models' mean profile quality (scale [0, 1])."""
    from boute.quality.profiles import load_profile

    p = load_profile(profile, "auto")
    return float(p.column(WEAK).mean()), float(p.column(STRONG).mean())


def _document(rng: np.random.Generator, seed: int) -> tuple[dict[str, Any], str, str, float]:
    """Everything but the rate, budget and cap (they need the hardware's speed): the scenario document."""
    from boute.catalog import builtin_catalog

    cat = builtin_catalog()
    models = _tiers(rng, {m: cat.model(m).params_b for m in MODELS})
    names = {2: ["small", "large"], 3: ["small", "mid", "large"], 4: ["small", "mid", "big", "large"]}[len(models)]
    dtype = "fp8" if rng.random() < 0.15 else "bf16"
    tiers = [
        {"name": nm, "model": m, "quality_model": STRONG if i == len(models) - 1 else WEAK, "dtype": dtype}
        for i, (nm, m) in enumerate(zip(names, models, strict=True))
    ]
    gpu_names = sorted(cat.gpus)
    k = int(rng.integers(2, 5))
    gpus = sorted(rng.choice(len(gpu_names), size=k, replace=False).tolist())
    counts = {gpu_names[i]: int(rng.choice([2, 4, 8, 8, 12, 16])) for i in gpus}
    prices = {
        g: round(cat.gpu(g).price_per_hour * float(np.clip(rng.lognormal(0.0, 0.2), 0.6, 1.6)), 3) for g in counts
    }
    shape = _pick(rng, SHAPES)
    _, source, in_rng, out_rng = SHAPES[shape]
    lengths: dict[str, Any] = {
        "source": "trace" if source == "trace" else "profile",
        "input_scale": round(_loguniform(rng, *in_rng), 3),
        "output_scale": round(_loguniform(rng, *out_rng), 3),
        "max_input": MAX_INPUT,
    }
    profile = source if source != "trace" else ("builtin:mt-bench" if rng.random() < 0.2 else "builtin:gsm8k")
    kind = _pick(rng, ARRIVALS)
    cv = round(float(rng.uniform(*GAMMA_CV)), 3) if kind == "gamma" else 1.0
    doc = {
        "name": f"random-{seed}",
        "description": f"random scenario {seed}: {shape} lengths, {kind} arrivals, {len(models)} tiers",
        "cluster": {"gpus": counts, "budget_per_hour": 1.0, "prices": prices},
        "tiers": tiers,
        "quality": {"profile": profile},
        "workload": {
            "arrivals": {"kind": kind, "trace": "builtin:azure-conv", "cv": cv},
            "rate_rps": 1.0,
            "lengths": lengths,
            "duration_s": 60.0,
            "seed": seed % (2**31),
        },
        "targets": {"quality_floor": 0.0, "p95_latency_s": 30.0},
    }
    return doc, shape, kind, cv


def draw_scenario(seed: int, *, max_tries: int = 64) -> ScenarioDraw:
    """The random scenario of ``seed`` and what was drawn (module doc); redraws a hardware mix that cannot
    serve some tier, so every seed gives a valid scenario (``max_tries`` bounds a pathological stream)."""
    from boute.workload import build_workload, workload_stats

    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5CE]))
    for _ in range(max_tries):
        doc, shape, kind, cv = _document(rng, seed)
        probe = Scenario.model_validate(doc)
        stats = workload_stats(build_workload(probe, rate_rps=10.0, duration_s=600.0))
        weak_q, strong_q = _profile_quality(doc["quality"]["profile"])
        position = float(rng.uniform(0.0, 0.5))
        floor = weak_q + position * max(strong_q - weak_q, 0.0)
        # the strong tier's share the floor needs if routing were blind (a router needs less): the split the
        # capacity is estimated for, the small tiers sharing the rest equally
        n = len(doc["tiers"])
        strong_share = max(position, 0.1)
        split = [(1.0 - strong_share) / (n - 1)] * (n - 1) + [strong_share]
        inventory_cost = sum(doc["cluster"]["prices"][g] * c for g, c in doc["cluster"]["gpus"].items())
        budget = float(rng.uniform(0.25, 0.8)) * inventory_cost
        doc["cluster"]["budget_per_hour"] = round(budget, 2)
        try:
            est = capacity_estimate(Scenario.model_validate(doc), stats, split, raise_budget=True)
        except InfeasibleError:
            continue
        load = float(rng.uniform(*LOAD_RANGE))
        rate = load * est.rate_rps
        doc["cluster"]["budget_per_hour"] = round(est.budget, 2)
        doc["workload"]["rate_rps"] = round(rate, 4)
        cap = round(est.idle_p95_s * _loguniform(rng, 2.0, 10.0), 3)
        horizon = min(max(MIN_REQUESTS / rate, CAP_HORIZONS * cap), MAX_REQUESTS / rate)
        doc["workload"]["duration_s"] = round(float(np.clip(horizon, *HORIZON_S)), 1)
        doc["targets"] = {"quality_floor": round(floor, 4), "p95_latency_s": cap}
        sc = Scenario.model_validate(doc)
        return ScenarioDraw(seed, sc, shape, kind, cv, load, est.rate_rps, stats.mean_input, stats.mean_output)
    raise InfeasibleError(f"seed {seed}: no serviceable hardware mix in {max_tries} draws")


@dataclass(frozen=True)
class CapacityEstimate:
    rate_rps: float  # largest rate the greedy deployment sustains at the split
    budget: float  # the budget, raised if a tier could not buy one replica
    idle_p95_s: float  # idle latency of a P95-long answer on the largest tier's fastest replica


def capacity_estimate(
    scenario: Scenario, stats: Any, split: list[float], *, raise_budget: bool = False
) -> CapacityEstimate:
    """The largest rate a greedy deployment within the budget and inventory sustains when tier k gets
    ``split[k]`` of it: replicas are added one at a time to the tier whose capacity per unit of load is
    lowest, each the most req/s per dollar that still fits (capacity per replica from
    :func:`boute.sim.capacity.capacity_rps`). An estimate: real plans balance tiers less well.

    ``raise_budget``: first raise the budget to 1.25x the price of one cheapest replica per tier plus, for
    the strongest tier, enough replicas for its share of a rate the weak tiers' first replicas carry.
    Raises InfeasibleError when some tier fits no GPU type of the inventory.
    """
    from boute.optimize.space import Space
    from boute.perf import replica_perf, scenario_catalog
    from boute.sim.capacity import Lengths, capacity_rps
    from boute.sim.timing import DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_RUNNING, build_timing

    big = scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"budget_per_hour": 1e9})})
    space = Space.build(big)
    cat = scenario_catalog(scenario)
    ln = Lengths(stats.mean_input, stats.input_sq_mean, stats.mean_output, stats.output_sq_mean)
    n_t = len(scenario.tiers)
    options: list[list[tuple[float, float, str, int, Any]]] = [[] for _ in range(n_t)]
    for p in space.pairs:
        t = scenario.tiers[p.tier]
        for c in p.configs:
            perf = replica_perf(cat.model(t.model), cat.gpu(p.gpu), tp=c.tp, pp=c.pp, dtype=t.dtype)
            tm = build_timing(perf, DEFAULT_CHUNK_TOKENS, DEFAULT_MAX_RUNNING)
            options[p.tier].append((capacity_rps(tm, ln), c.gpus * p.price, p.gpu, c.gpus, tm))
    missing = [scenario.tiers[k].model for k in range(n_t) if not options[k]]
    if missing:
        raise InfeasibleError(f"{', '.join(missing)} fits no GPU type of {sorted(scenario.cluster.gpus)}")
    budget = scenario.cluster.budget_per_hour
    if raise_budget:
        cheapest = [min(o[1] for o in opts) for opts in options]
        best_pd = [max(o[0] / o[1] for o in opts) for opts in options]
        base_rate = min(max(o[0] for o in options[k]) / max(split[k], 1e-9) for k in range(n_t - 1))
        need = sum(cheapest) + max(0.0, base_rate * split[-1] / best_pd[-1] - cheapest[-1])
        inventory_cost = sum(scenario.price(g) * c for g, c in scenario.cluster.gpus.items())
        budget = min(max(budget, 1.25 * need), inventory_cost)
    inventory = dict(scenario.cluster.gpus)
    cap = [0.0] * n_t
    left = budget
    while True:
        k = min(range(n_t), key=lambda j: cap[j] / max(split[j], 1e-9))
        fits = [o for o in options[k] if o[1] <= left + 1e-9 and o[3] <= inventory[o[2]]]
        if not fits:
            break
        mu, price, gpu, used, _ = max(fits, key=lambda o: (o[0] / max(o[1], 1e-9), o[0]))
        cap[k] += mu
        left -= price
        inventory[gpu] -= used
    rate = min(cap[k] / max(split[k], 1e-9) for k in range(n_t))
    if rate <= 0:
        raise InfeasibleError(f"budget ${budget:.2f}/h cannot buy one replica of every tier")
    # the largest tier's fastest replica, idle: its prefill of a mean prompt plus a P95-long answer's steps
    tm = min((o[4] for o in options[-1]), key=lambda t: t.step(1, ln.mean_in))
    p95_out = max(1.0, stats.p95_output)
    idle = tm.prefill(max(1, round(ln.mean_in)), ln.mean_in**2, 1.0) + p95_out * tm.step(1, ln.mean_in + p95_out / 2)
    return CapacityEstimate(float(rate), float(budget), float(idle))


__all__ = ["CapacityEstimate", "ScenarioDraw", "capacity_estimate", "draw_scenario", "random_scenario"]
