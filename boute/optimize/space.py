"""The search space: routing fractions + heterogeneous deployment, encoded in the unit box [0,1]^d.

Why a box: the GP surrogate and the baselines (random, NSGA-II) all work on ``[0,1]^d``; every point of
the box decodes to a *valid* deployment (budget, inventory, memory fit, TP divides heads), so no
infeasible candidate ever reaches an evaluator. The encoding (documented in docs/optimizer.md):

* routing, ``n_tiers - 1`` dims, stick-breaking: ``f_0 = u_0``, ``f_i = u_i * (1 - sum_{j<i} f_j)``, the last
  tier takes the rest. Every ``u`` gives fractions on the simplex and the map is onto.
* deployment, for each (tier, GPU type) pair that has at least one fitting (TP, PP) config:
  - a *GPU share* dim: ``gpus = round(u * inventory[g])`` GPUs of type g for the tier (discrete values
    ``j / inventory``);
  - a *config* dim (only when more than one (TP, PP) fits): category ``k = floor(u * K)`` of the fitting
    configs, so replicas ``= gpus // (tp * pp)``.
* repair, deterministic: (1) each GPU type's inventory, by taking replicas from the group using most of it;
  (2) the budget, by taking replicas from the most expensive group, sparing a tier's last replica while
  possible; (3) every tier that receives load keeps a replica: the cheapest fitting one that still fits
  is added, else its load share is folded into the next larger deployed tier.

``encode(decode(x))`` is the *canonical* point of the decoded plan; ``decode`` of a canonical point is the
same plan (no repair needed), which is what the GP is trained on.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from boute.errors import InfeasibleError
from boute.optimize.repair import fit_budget, fit_inventory
from boute.specs import ReplicaGroup, Scenario

#: Routing shares at or below this are floating-point residue of stick-breaking, not load: shares that sum to 1
#: only up to round-off (``(a, b + c, 0)`` after the tier-off move) invert to a ``u`` a hair below 1, whose
#: decode leaves ~1e-17 on the last tier, and repair step (3) would buy that tier a paid replica. One request in
#: 10^12 is no traffic, so such a share is snapped to 0 (and the rest renormalised) before repair sees it.
SHARE_EPS = 1e-12


@dataclass(frozen=True)
class Config:
    tp: int
    pp: int

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class Pair:
    """One (tier, GPU type) choice and the (TP, PP) configs of the tier's model that fit that GPU."""

    tier: int
    gpu: str
    configs: tuple[Config, ...]
    inventory: int
    price: float
    count_dim: int
    config_dim: int | None

    def config_value(self, k: int) -> float:
        """The config dim's value for category ``k``: the middle of its bin, so round-off never changes it."""
        return (k + 0.5) / len(self.configs)

    def set_config(self, x: np.ndarray, k: int) -> None:
        """Select category ``k`` in point ``x`` (in place; a pair with one config has no dim to set)."""
        if self.config_dim is not None:
            x[self.config_dim] = self.config_value(k)

    def config_index(self, x: np.ndarray) -> int:
        """The (TP, PP) category that point ``x`` selects: the config dim's [0, 1] cut into equal bins."""
        if self.config_dim is None:
            return 0
        return min(len(self.configs) - 1, int(x[self.config_dim] * len(self.configs)))


@dataclass(frozen=True)
class Candidate:
    """A decoded point: routing fractions (one per tier) and replica groups that satisfy the hard limits."""

    fractions: tuple[float, ...]
    deployment: tuple[ReplicaGroup, ...]
    cost_per_hour: float

    def key(self) -> str:
        """Identity of the decision, used to recognise duplicates."""
        fr = ",".join(f"{f:.4f}" for f in self.fractions)
        return f"{fr}|{self.deployment_key()}"

    def deployment_key(self) -> str:
        """Identity of the deployment alone (the part of :meth:`key` after ``|``): plans that differ only in
        routing share it, and their $/h."""
        return ";".join(f"{g.tier}/{g.gpu}/{g.count}x{g.tp}x{g.pp}" for g in self.deployment)


def fitting_configs(scenario: Scenario, tier: int, gpu: str, max_gpus: int | None = None) -> tuple[Config, ...]:
    """All (TP, PP) of the tier's model that fit one node of ``gpu`` and the inventory (TP | heads)."""
    from boute.perf import replica_perf, scenario_catalog

    cat = scenario_catalog(scenario)
    t = scenario.tiers[tier]
    model, spec = cat.model(t.model), cat.gpu(gpu)
    limit = min(spec.gpus_per_node, scenario.cluster.gpus[gpu] if max_gpus is None else max_gpus)
    out = []
    for tp in (1, 2, 4, 8, 16):
        for pp in (1, 2, 4, 8, 16):
            if tp * pp > limit or model.heads % tp or pp > model.layers:
                continue
            if replica_perf(model, spec, tp, pp, t.dtype).fits:
                out.append(Config(tp, pp))
    if not out:
        return ()
    # PP only buys memory (it does not shorten a forward pass), so PP > 1 is kept only at the smallest GPU
    # count that fits; pure TP is kept at every size. This prunes dominated configs from the space.
    least = min(c.gpus for c in out)
    out = [c for c in out if c.pp == 1 or c.gpus == least]
    # fewest GPUs first, then more TP (lower latency per GPU count): index order is meaningful to the GP
    return tuple(sorted(out, key=lambda c: (c.gpus, -c.tp)))


@dataclass(frozen=True)
class Space:
    """The encoded search space of one scenario (optionally restricted: GPU types, tiers, fixed routing)."""

    scenario: Scenario
    gpus: tuple[str, ...]
    active_tiers: tuple[int, ...]
    fixed_fractions: tuple[float, ...] | None
    pairs: tuple[Pair, ...]
    n_routing: int
    dim: int
    budget: float
    inventory: dict[str, int] = field(hash=False)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        scenario: Scenario,
        *,
        gpus: tuple[str, ...] | None = None,
        tiers: tuple[int, ...] | None = None,
        fixed_fractions: tuple[float, ...] | None = None,
    ) -> Space:
        """Raise InfeasibleError when no tier can be deployed on any allowed GPU within the budget."""
        names = tuple(g for g in scenario.cluster.gpus if scenario.cluster.gpus[g] > 0 and (gpus is None or g in gpus))
        active = tuple(range(len(scenario.tiers))) if tiers is None else tuple(sorted(tiers))
        n_t = len(scenario.tiers)
        if fixed_fractions is not None and len(fixed_fractions) != n_t:
            raise ValueError(f"fixed_fractions needs {n_t} values")
        n_routing = 0 if fixed_fractions is not None or len(active) == 1 else len(active) - 1
        dim = n_routing
        pairs: list[Pair] = []
        budget = scenario.cluster.budget_per_hour
        for ti in active:
            for g in names:
                price = scenario.price(g)
                configs = tuple(c for c in fitting_configs(scenario, ti, g) if c.gpus * price <= budget + 1e-9)
                if not configs:
                    continue
                cdim = None
                count_dim = dim
                dim += 1
                if len(configs) > 1:
                    cdim = dim
                    dim += 1
                pairs.append(Pair(ti, g, configs, scenario.cluster.gpus[g], price, count_dim, cdim))
        if not pairs:
            raise InfeasibleError(
                f"no tier fits any allowed GPU within ${budget:g}/h (tiers: "
                f"{', '.join(scenario.tiers[i].model for i in active)}; GPUs: {', '.join(names) or 'none'})"
            )
        return cls(
            scenario=scenario,
            gpus=names,
            active_tiers=active,
            fixed_fractions=fixed_fractions,
            pairs=tuple(pairs),
            n_routing=n_routing,
            dim=dim,
            budget=budget,
            inventory={g: scenario.cluster.gpus[g] for g in names},
        )

    # ---- discrete structure (for mixed-variable acquisition optimisers) ---------------------------
    def discrete_dims(self) -> dict[int, list[float]]:
        """Ordinal dims (GPU shares) and the values they take."""
        return {p.count_dim: [j / p.inventory for j in range(p.inventory + 1)] for p in self.pairs}

    def categorical_dims(self) -> dict[int, list[float]]:
        """Categorical dims (the (TP, PP) choice): category k sits at (k + 0.5) / K."""
        return {
            p.config_dim: [p.config_value(k) for k in range(len(p.configs))]
            for p in self.pairs
            if p.config_dim is not None
        }

    def routing_dims(self) -> list[int]:
        return list(range(self.n_routing))

    def placement_dims(self) -> list[int]:
        return list(range(self.n_routing, self.dim))

    # ---- decoding -------------------------------------------------------------------------------
    def _fractions(self, x: np.ndarray) -> np.ndarray:
        n_t = len(self.scenario.tiers)
        if self.fixed_fractions is not None:
            return np.asarray(self.fixed_fractions, dtype=float)
        fr = np.zeros(n_t)
        rest = 1.0
        for j, ti in enumerate(self.active_tiers[:-1]):
            fr[ti] = float(x[j]) * rest
            rest -= fr[ti]
        fr[self.active_tiers[-1]] = max(0.0, rest)
        residue = (fr > 0.0) & (fr <= SHARE_EPS)
        if residue.any():  # only then: every other decode stays bit-for-bit what it was
            fr[residue] = 0.0
            fr /= fr.sum()
        return fr

    def decode(self, x: np.ndarray) -> Candidate:
        """A valid candidate for any x in [0,1]^d (values outside are clipped)."""
        x = np.clip(np.asarray(x, dtype=float).reshape(-1), 0.0, 1.0)
        if x.shape[0] != self.dim:
            raise ValueError(f"expected {self.dim} dims, got {x.shape[0]}")
        fr = self._fractions(x)
        cfg: list[Config] = []
        reps: list[int] = []
        dims, inventory = self._count_dims
        gpus = np.rint(x[dims] * inventory).astype(np.int64).tolist()  # half to even, as round() is
        for p, n in zip(self.pairs, gpus, strict=True):
            c = p.configs[p.config_index(x)]
            cfg.append(c)
            reps.append(n // c.gpus)
        reps = self._repair(fr, cfg, reps)
        return self._candidate(fr, cfg, reps)

    @functools.cached_property
    def _pairs_on(self) -> dict[str, np.ndarray]:
        """Per GPU type, the indices of its pairs (ascending)."""
        return {
            g: np.array([i for i, p in enumerate(self.pairs) if p.gpu == g], dtype=np.int64) for g in self.inventory
        }

    @functools.cached_property
    def _count_dims(self) -> tuple[np.ndarray, np.ndarray]:
        """Each pair's count dim and its GPU type's inventory (a count dim of 1 is all of it), in pair order."""
        return np.array([p.count_dim for p in self.pairs]), np.array([p.inventory for p in self.pairs])

    @functools.cached_property
    def _pair_price(self) -> np.ndarray:
        return np.array([p.price for p in self.pairs], dtype=float)

    @functools.cached_property
    def _pair_tier(self) -> np.ndarray:
        return np.array([p.tier for p in self.pairs], dtype=np.int64)

    def _per_tier(self, reps: list[int]) -> list[int]:
        """Replicas per tier (all of the scenario's tiers, by index)."""
        out = [0] * len(self.scenario.tiers)
        for p, r in zip(self.pairs, reps, strict=True):
            out[p.tier] += r
        return out

    def _cost(self, cfg: list[Config], reps: list[int]) -> float:
        """$/h of ``reps`` replicas per pair at configs ``cfg``: sum of replicas x GPUs per replica x price."""
        return float(sum(r * c.gpus * p.price for p, c, r in zip(self.pairs, cfg, reps, strict=True)))

    def _repair(self, fr: np.ndarray, cfg: list[Config], reps: list[int]) -> list[int]:
        """(1) each GPU type's inventory and (2) the budget (:mod:`boute.optimize.repair`); (3) a replica for
        every tier with load (module doc)."""
        pairs = self.pairs
        r = np.asarray(reps, dtype=np.int64)
        gpus = np.array([c.gpus for c in cfg], dtype=np.int64)
        fit_inventory(r, gpus, self._pairs_on, self.inventory)
        fit_budget(r, gpus, self._pair_price, self._pair_tier, len(self.scenario.tiers), self.budget)
        reps = r.tolist()
        # (3) every tier with load needs a replica: add the cheapest one that fits the remaining limits
        for ti in self.active_tiers:
            if fr[ti] <= 0 or self._per_tier(reps)[ti] > 0:
                continue
            left = self.budget - self._cost(cfg, reps)
            best: tuple[float, int, Config] | None = None
            for i, p in enumerate(pairs):
                if p.tier != ti:
                    continue
                used = sum(reps[j] * cfg[j].gpus for j, q in enumerate(pairs) if q.gpu == p.gpu)
                for c in p.configs:
                    price = c.gpus * p.price
                    if price <= left + 1e-9 and used + c.gpus <= p.inventory and (best is None or price < best[0]):
                        best = (price, i, c)
            if best is not None:  # the tier has no replica, so reps[i] == 0 and its config is free to change
                _, i, c = best
                cfg[i] = c
                reps[i] = 1
        return reps

    def _group(self, i: int, c: Config, count: int) -> ReplicaGroup:
        """Pair ``i``'s replica group of ``count`` replicas at config ``c``: one frozen instance per distinct group,
        built once (a search decodes tens of thousands of points made of a few thousand distinct groups, and
        validating each group again was a tenth of a 480-GPU fleet's decode time)."""
        key = (i, c.tp, c.pp, count)
        got = self._groups.get(key)
        if got is None:
            p, t = self.pairs[i], self.scenario.tiers[self.pairs[i].tier]
            got = ReplicaGroup(tier=t.name, model=t.model, gpu=p.gpu, count=count, tp=c.tp, pp=c.pp, dtype=t.dtype)
            self._groups[key] = got
        return got

    @functools.cached_property
    def _groups(self) -> dict[tuple[int, int, int, int], ReplicaGroup]:
        return {}

    def _candidate(self, fr: np.ndarray, cfg: list[Config], reps: list[int]) -> Candidate:
        tiers = self.scenario.tiers
        groups = [self._group(i, c, r) for i, (c, r) in enumerate(zip(cfg, reps, strict=True)) if r > 0]
        deployed = {g.tier for g in groups}
        fr = fr.copy()
        # fold load of undeployable tiers into the nearest larger deployed tier (else the nearest smaller)
        for ti in range(len(tiers)):
            if fr[ti] > 0 and tiers[ti].name not in deployed:
                order = [*range(ti + 1, len(tiers)), *range(ti - 1, -1, -1)]
                dest = next((j for j in order if tiers[j].name in deployed), None)
                if dest is None:
                    raise InfeasibleError(f"budget ${self.budget:g}/h cannot buy one replica of any tier")
                fr[dest] += fr[ti]
                fr[ti] = 0.0
        if not groups:
            raise InfeasibleError(f"budget ${self.budget:g}/h cannot buy one replica of any tier")
        fr = fr / fr.sum()
        return Candidate(tuple(float(f) for f in fr), tuple(groups), self._cost(cfg, reps))

    # ---- encoding -------------------------------------------------------------------------------
    def routing_point(self, fractions: np.ndarray | tuple[float, ...]) -> np.ndarray:
        """The routing dims (stick-breaking inverse) that decode to ``fractions`` (one value per tier)."""
        u = np.zeros(self.n_routing)
        fr = np.asarray(fractions, dtype=float)
        rest = 1.0
        for j, ti in enumerate(self.active_tiers[: self.n_routing]):
            u[j] = 0.0 if rest <= SHARE_EPS else min(1.0, max(0.0, fr[ti] / rest))
            rest -= fr[ti]
        return u

    def encode(self, cand: Candidate) -> np.ndarray:
        """The canonical point of a candidate: ``decode(encode(c))`` gives ``c`` back."""
        x = np.zeros(self.dim)
        x[: self.n_routing] = self.routing_point(cand.fractions)
        by_key = {(g.tier, g.gpu): g for g in cand.deployment}
        tiers = self.scenario.tiers
        for p in self.pairs:
            g = by_key.get((tiers[p.tier].name, p.gpu))
            if g is None:
                continue
            k = p.configs.index(Config(g.tp, g.pp))
            x[p.count_dim] = g.gpus_used / p.inventory
            p.set_config(x, k)
        return x

    def canonical(self, x: np.ndarray) -> np.ndarray:
        return self.encode(self.decode(x))

    def describe(self) -> dict[str, object]:
        return {
            "dim": self.dim,
            "routing_dims": self.n_routing,
            "pairs": [
                {
                    "tier": self.scenario.tiers[p.tier].name,
                    "gpu": p.gpu,
                    "configs": [f"tp{c.tp}pp{c.pp}" for c in p.configs],
                }
                for p in self.pairs
            ],
            "gpus": list(self.gpus),
        }


def is_valid(space: Space, cand: Candidate) -> str | None:
    """Why a candidate breaks a hard limit, or None; the property tests call this on every decode."""
    sc = space.scenario
    if not math.isclose(sum(cand.fractions), 1.0, abs_tol=1e-9) or min(cand.fractions) < 0:
        return f"fractions {cand.fractions} not on the simplex"
    if cand.cost_per_hour > sc.cluster.budget_per_hour + 1e-6:
        return f"cost {cand.cost_per_hour} over budget"
    from boute.perf import scenario_catalog

    used: dict[str, int] = {}
    cat = scenario_catalog(sc)
    for g in cand.deployment:
        used[g.gpu] = used.get(g.gpu, 0) + g.gpus_used
        if cat.model(g.model).heads % g.tp:
            return f"tp {g.tp} does not divide heads of {g.model}"
        pair = next(p for p in space.pairs if sc.tiers[p.tier].name == g.tier and p.gpu == g.gpu)
        if Config(g.tp, g.pp) not in pair.configs:
            return f"{g.model} tp{g.tp}pp{g.pp} does not fit {g.gpu}"
    for gpu, n in used.items():
        if n > sc.cluster.gpus[gpu]:
            return f"{gpu}: {n} used of {sc.cluster.gpus[gpu]}"
    deployed = {g.tier for g in cand.deployment}
    for t, f in zip(sc.tiers, cand.fractions, strict=True):
        if f > 0 and t.name not in deployed:
            return f"tier {t.name} gets load but has no replica"
    return None
