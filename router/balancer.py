"""Balancing a tier's heterogeneous replicas: capacity weights x least outstanding requests, with health.

Why: replicas of one tier run on different GPU types (an H100 decodes several times faster than an RTX
4090), so round-robin would overload the slow ones. Each replica gets a weight proportional to its
modelled capacity under the plan's own request lengths, the figures the plan carries (``Plan.balance``,
:mod:`boute.sim.weights`: the simulator's rule), and a request goes to the available replica with the
fewest outstanding requests *per unit of weight*, as in the simulator that judged the plan. Health has two
sources: active checks (``GET /health``: out at once when refused or not 200, after ``cb_failures`` checks
in a row without an answer in time) and passive outcomes of real requests; ``cb_failures`` consecutive
failures that are the replica's (or one refused connection; a read timeout is the request's, see
router/errors.py) open the replica's circuit for ``cooldown_s``. When the cooldown ends the replica is half-open: its failure
count is kept, so the next failure re-opens it at once, and a success closes it.

With prefix affinity in force (the plan's ``affinity`` section, or the gateway's ``BOUTE_AFFINITY`` /
``--affinity``), a request whose prompt keys are given goes by the cache-aware rule of :mod:`boute.sim.affinity`
(one index per tier) among the same available replicas, and by the least-load rule above wherever that rule
says so. A replica taken out (its circuit opened, a failed health check, a peer's down-mark, gone from the
registry) is forgotten by its tier's index at once: its prefixes go to the rendezvous choice among the others,
and when it comes back it takes new prefixes (its rendezvous share) and least-load fallbacks, not a flood of
prefixes it may no longer hold. A plan or registry update keeps the index, and so the affinity of the replicas
that stay, unless the affinity figures themselves changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from boute.serving import BackendSpec
from boute.specs.balancing import Affinity
from boute.specs.plan import Plan
from router.config import Settings

if TYPE_CHECKING:  # boute.sim loads on the first plan, not with the gateway's imports
    from boute.serving.weights import Weights
    from boute.sim.affinity import AffinityIndex, PromptKeys
    from router.upstream import Endpoint

log = logging.getLogger("boute.router.balancer")

#: told of each request the affinity rule placed: (tier, reason, prefix characters matched, characters hashed)
RouteHook = Callable[[str, str, int, int], None]


def affinity_in_force(plan: Plan | None, override: bool | None) -> Affinity | None:
    """The affinity settings the gateway balances by, None for least load only. On or off: the gateway's
    ``override`` (``BOUTE_AFFINITY``, ``--affinity``/``--no-affinity``) where set, else the plan's section's
    ``enabled`` (no section: off, so a plan without one is balanced exactly as before). The figures: the plan's
    section, else :class:`~boute.specs.plan.Affinity`'s defaults."""
    if override is None:
        return plan.affinity_in_force() if plan is not None else None
    section = plan.affinity if plan is not None else None
    if not override:
        return None
    return section if section is not None else Affinity()


class StatusClient(Protocol):
    """What the health checks need of the gateway's upstream pool (:class:`router.upstream.Pool`)."""

    async def get_status(self, url: str, path: str, timeout: float) -> int: ...


@dataclass(slots=True, eq=False)
class BackendState:
    """Runtime state of one backend; objects survive plan/registry updates so counters stay exact."""

    spec: BackendSpec
    weight: float = 1.0
    outstanding: int = 0
    healthy: bool = True
    failures: int = 0
    open_until: float = 0.0
    served: int = 0
    failed: int = 0
    slow_checks: int = 0  # health checks in a row that got no answer within health_timeout_s
    url: str = field(init=False)
    inv_weight: float = field(init=False)
    targets: dict[str, Endpoint] = field(init=False, default_factory=dict)  # "" -> parsed URL (proxy's cache)

    def __post_init__(self) -> None:
        self.url = self.spec.url.rstrip("/")
        self.inv_weight = 1.0 / self.weight

    @property
    def id(self) -> str:
        return self.spec.id

    def available(self, now: float) -> bool:
        return self.healthy and now >= self.open_until

    def as_dict(self, now: float) -> dict[str, object]:
        return {
            "id": self.id,
            "url": self.url,
            "tier": self.spec.tier,
            "model": self.spec.model,
            "gpu": self.spec.gpu,
            "tp": self.spec.tp,
            "pp": self.spec.pp,
            "weight": round(self.weight, 4),
            "outstanding": self.outstanding,
            "healthy": self.healthy,
            "circuit": "open" if now < self.open_until else ("half-open" if self.failures else "closed"),
            "failures": self.failures,
            "served": self.served,
            "failed": self.failed,
        }


class Balancer:
    """Tier -> replicas, picking and health bookkeeping. Single event loop: no locks needed."""

    def __init__(
        self, settings: Settings, on_trip: Callable[[str], None] | None = None, on_route: RouteHook | None = None
    ) -> None:
        self.settings = settings
        self.pools: dict[str, list[BackendState]] = {}
        self.by_id: dict[str, BackendState] = {}
        self._on_trip = on_trip
        self._on_route = on_route
        #: the affinity settings in force (None: least load only) and each tier's prefix index
        self.affinity: Affinity | None = None
        self.indexes: dict[str, AffinityIndex] = {}
        self._rr = 0
        self._weights_of: tuple[Plan | None, Weights] | None = None  # the plan's replica capacities

    # ---- configuration ------------------------------------------------------------------------
    def configure(self, plan: Plan | None, backends: Iterable[BackendSpec], root: Path | None = None) -> None:
        """Rebuild pools for a plan + registry, keeping runtime state of replicas that stay. ``root``: where
        the plan's bundle files are (for a plan written before plans carried their balance figures)."""
        tiers = set(plan.routing.tiers) if plan is not None else None
        if self._weights_of is None or plan != self._weights_of[0]:
            from boute.serving.weights import plan_weights

            self._weights_of = (plan, plan_weights(plan, root))
            if self._weights_of[1].source != "plan":
                log.info("replica weights: capacities under the %s's request lengths", self._weights_of[1].source)
        weights = self._weights_of[1]
        pools: dict[str, list[BackendState]] = {}
        by_id: dict[str, BackendState] = {}
        for spec in backends:
            if tiers is not None and spec.tier not in tiers:
                continue
            weight = self._capacity(weights, plan, spec)
            old = self.by_id.get(spec.id)
            if old is not None and old.spec == spec:
                rep = old
            else:
                rep = BackendState(spec)
                if old is not None:
                    rep.outstanding, rep.healthy, rep.open_until = old.outstanding, old.healthy, old.open_until
            rep.weight = weight  # normalised below; 0 = unknown hardware
            pools.setdefault(spec.tier, []).append(rep)
            by_id[spec.id] = rep
        for reps in pools.values():  # normalise: unknown hardware gets the tier's mean weight
            known = [r.weight for r in reps if r.weight > 0]
            mean = sum(known) / len(known) if known else 1.0
            for r in reps:
                w = r.weight if r.weight > 0 else mean
                r.weight, r.inv_weight = w / mean, mean / w
        self._index_tiers(affinity_in_force(plan, self.settings.affinity), pools)
        self.pools, self.by_id = pools, by_id

    def _index_tiers(self, settings: Affinity | None, pools: dict[str, list[BackendState]]) -> None:
        """One prefix index per tier under ``settings`` (None: none). A tier's index is kept across updates
        while the figures stay the same, forgetting only the replicas that left it or changed."""
        if settings is None:
            self.affinity, self.indexes = None, {}
            return
        from boute.sim.affinity import AffinityIndex

        indexes: dict[str, AffinityIndex] = {}
        for tier, reps in pools.items():
            index = self.indexes.get(tier) if settings == self.affinity else None
            if index is None:
                index = AffinityIndex(settings)
            stay = {id(r) for r in reps}
            for old in self.pools.get(tier, ()):
                if id(old) not in stay:
                    index.forget(old.id)
            indexes[tier] = index
        self.affinity, self.indexes = settings, indexes

    @staticmethod
    def _capacity(weights: Weights, plan: Plan | None, spec: BackendSpec) -> float:
        """The replica's capacity by the plan's figures (0: unknown hardware)."""
        gpu, tp, pp, dtype = spec.gpu, spec.tp, spec.pp, spec.dtype
        if gpu is None and plan is not None:  # take the hardware from the plan's group for this tier/model
            for g in plan.deployment:
                if g.tier == spec.tier and g.model == spec.model:
                    gpu, tp, pp, dtype = g.gpu, g.tp, g.pp, g.dtype
                    break
        if gpu is None:
            return 0.0
        return weights.of((spec.model, gpu, tp, pp, dtype)) or 0.0

    # ---- picking ------------------------------------------------------------------------------
    def pick(
        self, tier: str, exclude: tuple[BackendState, ...] = (), keys: PromptKeys | None = None
    ) -> BackendState | None:
        """The available replica (not in ``exclude``) for a request: by the affinity rule when it is in force
        and the prompt's ``keys`` are given, else the one with the least outstanding requests per unit of
        capacity."""
        reps = self.pools.get(tier)
        if not reps:
            return None
        if keys is not None:
            index = self.indexes.get(tier)
            if index is not None:
                return self._pick_by_prefix(tier, reps, index, keys, exclude)
        return self._least(reps, time.monotonic(), exclude)

    def _pick_by_prefix(
        self,
        tier: str,
        reps: list[BackendState],
        index: AffinityIndex,
        keys: PromptKeys,
        exclude: tuple[BackendState, ...],
    ) -> BackendState | None:
        """The affinity rule over the available replicas, least load where it says so; the choice recorded."""
        now = time.monotonic()
        cands = [r for r in reps if r.available(now) and r not in exclude]
        if not cands:
            return None
        route = index.choose(keys, [r.id for r in cands], [r.outstanding for r in cands], [r.weight for r in cands])
        r = cands[route.choice] if route.choice is not None else self._least(cands, now, ())
        assert r is not None  # cands is not empty, and all of it available
        index.record(keys.keys, r.id)
        if self._on_route is not None:
            self._on_route(tier, route.reason, route.matched_chars, keys.chars)
        return r

    def _least(self, reps: list[BackendState], now: float, exclude: tuple[BackendState, ...]) -> BackendState | None:
        """The least-load rule: the available replica with the fewest ``(outstanding + 1) / weight``, the scan's
        start rotated so that ties spread out."""
        n = len(reps)
        self._rr = (self._rr + 1) % n  # rotate the scan start so ties spread out
        best: BackendState | None = None
        best_load = 0.0
        for i in range(n):
            r = reps[(self._rr + i) % n]
            if not r.available(now) or r in exclude:
                continue
            load = (r.outstanding + 1) * r.inv_weight
            if best is None or load < best_load:
                best, best_load = r, load
        return best

    def healthy(self, tier: str) -> int:
        now = time.monotonic()
        return sum(r.available(now) for r in self.pools.get(tier, ()))

    def healthy_tiers(self) -> dict[str, int]:
        now = time.monotonic()
        return {t: sum(r.available(now) for r in reps) for t, reps in self.pools.items()}

    # ---- passive health / circuit breaker ------------------------------------------------------
    def success(self, r: BackendState) -> None:
        r.served += 1
        r.failures = 0

    def failure(self, r: BackendState, *, refused: bool = False, charge: bool = True) -> None:
        """A request failed on ``r``. ``charge``: the failure is the replica's (connection-level, 5xx) and counts
        toward its circuit; one that may be the request's own (a read timeout) is only counted in ``failed``,
        so a heavy request retried across a tier cannot trip it (issue 28)."""
        r.failed += 1
        if not charge:
            return
        r.failures += 1
        if refused or r.failures >= self.settings.cb_failures:
            self.trip(r, self.settings.cooldown_s)
            if self._on_trip is not None:
                self._on_trip(r.id)

    def trip(self, r: BackendState, ttl: float) -> None:
        r.open_until = max(r.open_until, time.monotonic() + ttl)
        r.failures = max(r.failures, self.settings.cb_failures)
        self._forget(r)

    def _forget(self, r: BackendState) -> None:
        """``r`` is out: its tier's prefix index stops sending its prefixes there (module docstring)."""
        index = self.indexes.get(r.spec.tier)
        if index is not None:
            index.forget(r.id)

    def mark_down(self, backend_id: str, ttl: float) -> None:
        """A peer gateway tripped this replica (via Redis)."""
        r = self.by_id.get(backend_id)
        if r is not None:
            self.trip(r, ttl)

    # ---- active health checks -----------------------------------------------------------------
    async def check_all(self, client: StatusClient) -> None:
        reps = list(self.by_id.values())
        results = await asyncio.gather(*(self._check(client, r) for r in reps))
        for r, answer in zip(reps, results, strict=True):
            if answer is None:  # no answer in time: down only after cb_failures such checks in a row
                r.slow_checks += 1
                ok = r.healthy and r.slow_checks < self.settings.cb_failures
            else:
                r.slow_checks = 0
                ok = answer
            if ok != r.healthy:
                log.info("replica %s is now %s", r.id, "healthy" if ok else "unhealthy")
                if not ok:
                    self._forget(r)
            r.healthy = ok

    async def _check(self, client: StatusClient, r: BackendState) -> bool | None:
        """``GET /health`` through the gateway's upstream pool (:class:`router.upstream.Pool`): True when it
        answers 200, False when it refuses, drops the connection or answers otherwise, None when no answer
        came within ``health_timeout_s``. Why a third outcome: a replica busy with a heavy request can answer
        late once (the emulated one while it builds a long answer; a real server's tokenizer on a huge
        prompt), and taking it out on one late answer left a whole tier with none (issue 28). A replica that
        stays silent is still taken out, after ``cb_failures`` checks; a dead one at once (refused)."""
        try:
            return await client.get_status(r.url, "/health", self.settings.health_timeout_s) == 200
        except TimeoutError:
            return None
        except Exception:
            return False

    async def health_loop(self, client: StatusClient) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            try:
                await self.check_all(client)
            except Exception as exc:  # never let the checker die
                log.warning("health check round failed: %s", exc)
