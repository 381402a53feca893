"""Screens that keep known failures away from the evaluator: the quality floor and a capacity bound.

Two things about a candidate are known before any evaluation, and the search should never pay for them:

* **Quality.** With an exact quality model (``evaluator.quality_model``: the fast and sim evaluators),
  quality is a cheap known function of the routing fractions. :meth:`Screen.project` moves a proposal's
  routing into the region where that model meets the floor: along the segment from the proposed fractions
  towards "everything to the best tier" (which meets the floor, or the run is refused up front), it
  takes the first point that meets it (bisection on the segment). Routing already above the floor is
  untouched. A candidate still below the floor after decoding (the space's repair folded a tier's load
  away) is removed. Without an exact model (the live evaluator samples quality) nothing is projected.
* **Capacity.** Each tier's offered load (rate x the share of requests that visit it, from the policy) is
  compared with an *upper bound* on what its replicas can serve at saturation, from the performance model
  alone (:func:`replica_bound_rps`). A tier over its bound cannot be stable whatever the evaluator says,
  so the plan is removed. The bound is deliberately optimistic, so a plan the evaluator could find stable
  is never removed (tests check this against the fast path on sampled plans).

Every proposal and every acquisition-pool candidate goes through the same screen; :class:`ScreenCounts`
says how many each screen moved or removed (``boute optimize`` prints them and the tracking DB keeps them).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from boute.optimize.evaluators.base import policy_of
from boute.optimize.space import Candidate, Space
from boute.quality.policy_quality import PolicyResult, QualityModel
from boute.specs import ReplicaGroup
from boute.specs.targets import meets_floor

if TYPE_CHECKING:
    from boute.perf.model import ReplicaPerf
    from boute.workload import Workload

#: tokens in one large prefill pass used for the best-case per-token prefill cost (a big chunk amortises
#: the per-step overhead, which is what makes the bound optimistic)
PREFILL_TOKENS = 16384
#: verdicts :meth:`Screen.admit` keeps (a few hundred bytes each); past this many they are forgotten at once
ADMITTED_KEPT = 100_000
#: bisection steps on the projection segment (2^-20 of the segment: far below one held-out query's share)
PROJECT_STEPS = 20


@dataclass(frozen=True)
class ScreenCounts:
    """What one screen did: candidates seen, routing moved onto the floor, and removed by each screen."""

    seen: int = 0
    projected: int = 0  # routing below the floor, moved into the floor region (then screened further)
    quality: int = 0  # removed: still below the floor after decoding
    capacity: int = 0  # removed: some tier's offered load exceeds its replicas' saturated-throughput bound

    def after(self, moved: bool, removed: str | None) -> ScreenCounts:
        """These counts with one more candidate: ``moved`` onto the floor, ``removed`` by that screen
        (``quality`` or ``capacity``) or admitted (None)."""
        return ScreenCounts(
            self.seen + 1,
            self.projected + int(moved),
            self.quality + int(removed == "quality"),
            self.capacity + int(removed == "capacity"),
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class ScreenReport:
    """The counts of a search's screens: of the strategy's proposals and of MOBO's acquisition pool. Recorded
    with the experiment (``screen_counts``) as :meth:`to_json`'s ``{"search": {...}, "pool": {...}}``."""

    search: ScreenCounts
    pool: ScreenCounts

    def to_json(self) -> dict[str, dict[str, int]]:
        return {"search": self.search.as_dict(), "pool": self.pool.as_dict()}


def replica_bound_rps(perf: ReplicaPerf, mean_in: float, mean_out: float) -> float:
    """Upper bound on the requests/s one replica can complete, from the performance model alone.

    Two necessary conditions, each optimistic: decode cannot run more than the KV-limited batch ``B`` per
    step, and a step at batch ``B`` (context counted at the prompts only) takes at least
    ``decode_step_time``, so decode serves at most ``B / ((out - 1) * step)``; and every prompt token must
    be prefilled at no better than the per-token cost of one large prefill pass. The replica serves at most
    the smaller of the two (real engines also pay for their interplay, which only lowers the rate).
    """
    if not perf.fits:
        return 0.0
    b = int(perf.max_batch(mean_in, mean_out))
    if b < 1:
        return 0.0
    step = float(np.asarray(perf.decode_step_time(b, b * mean_in)).reshape(-1)[0])
    decode = math.inf if mean_out <= 1 or step <= 0 else b / ((mean_out - 1.0) * step)
    t = float(PREFILL_TOKENS)
    sq = t * min(max(mean_in, 1.0), t)  # whole prompts of the mean length packed into the pass
    pass_s = float(np.asarray(perf.prefill_time(t, sq)).reshape(-1)[0])
    prefill = math.inf if pass_s <= 0 else t / (max(mean_in, 1.0) * pass_s)
    return float(min(decode, prefill))


@dataclass
class Screen:
    """The two screens of one search space (module doc). ``quality_model=None``: capacity screen only."""

    space: Space
    quality_model: QualityModel | None
    mode: str = "preroute"
    rate_rps: float = 0.0
    mean_input: float = 1.0
    mean_output: float = 1.0
    #: each tier's own mean answer length (``Workload.output_at``); empty: every tier answers ``mean_output``
    tier_mean_output: tuple[float, ...] = ()
    capacity: bool = True
    search: ScreenCounts = field(default_factory=ScreenCounts)  # the strategy's proposals
    pool: ScreenCounts = field(default_factory=ScreenCounts)  # acquisition candidates (MOBO's pool)
    _bounds: dict[tuple[str, str, str, int, int, str], float] = field(default_factory=dict, repr=False)
    _q: dict[tuple[float, ...], PolicyResult] = field(default_factory=dict, repr=False)
    #: projected routing dims by the proposed routing dims' bytes: a pool's local moves mostly change the
    #: deployment only, so hundreds of its points share one routing and one bisection
    _proj: dict[bytes, tuple[np.ndarray, bool]] = field(default_factory=dict, repr=False)
    #: :meth:`admit`'s verdicts by the proposed point's bytes: a search's pools are rebuilt around the same
    #: incumbent step after step, so their neighbours repeat (27% of the 480-GPU fleet's 41,000 pool points)
    _admitted: dict[bytes, tuple[np.ndarray, Candidate, bool, str | None, str | None]] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def build(
        cls, space: Space, quality_model: QualityModel | None, mode: str = "preroute", workload: Workload | None = None
    ) -> Screen:
        """A screen for ``space`` with the moments (rate, mean lengths) of ``workload``: the search's own
        stream (``Evaluator.workload``), so the bound is computed on the requests the evaluator judges;
        None: the scenario's whole workload."""
        from boute.workload import build_workload, tier_workload_stats, workload_stats

        w = workload if workload is not None else build_workload(space.scenario)
        st = workload_stats(w)
        per_tier = tuple(t.mean_output for t in tier_workload_stats(w, None, len(space.scenario.tiers)))
        # where prompts share prefixes, the bound prefills and reserves only what no cache could have held
        # (Prefixes.least_prefill), so it stays an upper bound however well the caches do
        mean_in = st.mean_input if w.prefixes is None else w.prefixes.least_prefill()
        return cls(space, quality_model, mode, st.rate_rps, mean_in, st.mean_output, per_tier)

    # ---- quality ----------------------------------------------------------------------------------
    @property
    def floor(self) -> float:
        return self.space.scenario.targets.quality_floor

    def _policy(self, fractions: np.ndarray) -> PolicyResult:
        key = tuple(round(float(f), 12) for f in fractions)
        if key not in self._q:
            if len(self._q) > 200_000:
                self._q.clear()
            assert self.quality_model is not None
            self._q[key] = policy_of(self.quality_model, self.mode, key)
        return self._q[key]

    def quality(self, fractions: np.ndarray | tuple[float, ...]) -> float:
        return float(self._policy(np.asarray(fractions, dtype=float)).quality)

    def _best_tier(self) -> int:
        assert self.quality_model is not None
        tq = np.asarray(self.quality_model.tier_quality, dtype=float)
        return max(self.space.active_tiers, key=lambda i: (tq[i], i))

    def project(self, x: np.ndarray) -> tuple[np.ndarray, bool]:
        """``x`` with its routing moved into the floor region (module doc), and whether it moved. Only the
        routing dims change, so the result is cached on them."""
        sp = self.space
        x = np.clip(np.asarray(x, dtype=float).reshape(-1), 0.0, 1.0)
        if self.quality_model is None or sp.n_routing == 0:
            return x, False
        key = x[: sp.n_routing].tobytes()
        if key not in self._proj:
            if len(self._proj) > 200_000:
                self._proj.clear()
            self._proj[key] = self._project_routing(x[: sp.n_routing])
        u, moved = self._proj[key]
        if not moved:
            return x, False
        out = x.copy()
        out[: sp.n_routing] = u
        return out, True

    def _project_routing(self, u: np.ndarray) -> tuple[np.ndarray, bool]:
        """The routing dims ``u`` moved onto the floor: bisection on the segment towards the best tier."""
        sp = self.space
        x = np.zeros(sp.dim)
        x[: sp.n_routing] = u
        fr = sp._fractions(x)
        floor = self.floor
        if meets_floor(self.quality(fr), floor):
            return u, False
        best = np.zeros_like(fr)
        best[self._best_tier()] = 1.0
        if not meets_floor(self.quality(best), floor):
            return u, False  # nothing reaches the floor; the check in admit removes the candidate
        lo, hi = 0.0, 1.0
        for _ in range(PROJECT_STEPS):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if meets_floor(self.quality((1 - mid) * fr + mid * best), floor) else (mid, hi)
        for t in (hi, min(1.0, hi + 1e-6), min(1.0, hi + 1e-4), min(1.0, hi + 1e-2), 1.0):
            x[: sp.n_routing] = sp.routing_point((1 - t) * fr + t * best)
            if meets_floor(self.quality(sp._fractions(x)), floor):  # through the encoding's round-off
                break
        return x[: sp.n_routing].copy(), True

    # ---- capacity ---------------------------------------------------------------------------------
    def group_bound_rps(self, g: ReplicaGroup) -> float:
        """:func:`replica_bound_rps` of one replica of ``g`` at its tier's answer length (cached per tier,
        model, GPU, TP, PP, dtype)."""
        key = (g.tier, g.model, g.gpu, g.tp, g.pp, g.dtype)
        if key not in self._bounds:
            from boute.perf import replica_perf, scenario_catalog

            cat = scenario_catalog(self.space.scenario)
            perf = replica_perf(cat.model(g.model), cat.gpu(g.gpu), g.tp, g.pp, g.dtype)
            names = [t.name for t in self.space.scenario.tiers]
            out = self.tier_mean_output[names.index(g.tier)] if self.tier_mean_output else self.mean_output
            self._bounds[key] = replica_bound_rps(perf, self.mean_input, out)
        return self._bounds[key]

    def visits(self, fractions: tuple[float, ...]) -> np.ndarray:
        """Share of requests each tier processes: the policy's (exact model), else from the fractions."""
        if self.quality_model is not None:
            return np.asarray(self._policy(np.asarray(fractions, dtype=float)).visits, dtype=float)
        fr = np.asarray(fractions, dtype=float)
        if self.mode == "cascade":  # tier k sees every query not accepted before it
            return np.concatenate([[1.0], 1.0 - np.cumsum(fr)[:-1]])
        return fr

    def overload(self, cand: Candidate) -> str | None:
        """Why ``cand`` cannot carry its load (the first tier over its capacity bound), or None."""
        tiers = self.space.scenario.tiers
        load = self.rate_rps * self.visits(cand.fractions)
        for k, t in enumerate(tiers):
            if load[k] <= 1e-9:
                continue
            cap = sum(g.count * self.group_bound_rps(g) for g in cand.deployment if g.tier == t.name)
            if load[k] > cap:
                return f"capacity: tier '{t.name}' is offered {load[k]:.3g} req/s, its replicas serve at most {cap:.3g}"
        return None

    # ---- both ---------------------------------------------------------------------------------------
    def admit(self, x: np.ndarray, pool: bool = False) -> tuple[np.ndarray, Candidate, str | None]:
        """Project ``x``, decode it and screen the plan: ``(x projected, candidate, why removed or None)``,
        counted in :attr:`search` (a proposal) or :attr:`pool` (``pool``: an acquisition candidate). A point
        seen before gets its remembered verdict (all three steps are pure functions of ``x``) and is counted
        again. The projected point is shared with the memo: callers copy it before writing to it."""
        x = np.asarray(x, dtype=float).reshape(-1)
        key = x.tobytes()
        hit = self._admitted.get(key)
        if hit is None:
            xp, moved = self.project(x)
            cand = self.space.decode(xp)
            removed, why = self._removed(cand)
            if len(self._admitted) > ADMITTED_KEPT:
                self._admitted.clear()
            hit = self._admitted[key] = (xp, cand, moved, removed, why)
        xp, cand, moved, removed, why = hit
        if pool:
            self.pool = self.pool.after(moved, removed)
        else:
            self.search = self.search.after(moved, removed)
        return xp, cand, why

    def _removed(self, cand: Candidate) -> tuple[str | None, str | None]:
        """Which screen removes ``cand`` (``quality``, ``capacity``) and why, or ``(None, None)``."""
        if self.quality_model is not None and not meets_floor(self.quality(cand.fractions), self.floor):
            return "quality", f"quality: {self.quality(cand.fractions):.4f} < floor {self.floor:g} after routing repair"
        if self.capacity:
            why = self.overload(cand)
            if why is not None:
                return "capacity", why
        return None, None

    def summary(self) -> ScreenReport:
        return ScreenReport(self.search, self.pool)
