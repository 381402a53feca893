"""What a simulation returns: per-request timings and the aggregates the optimiser and users read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boute.sim.affinity import REASONS
from boute.stats import quantile as _quantile  # unfinished requests (inf) count as the slowest


@dataclass(frozen=True)
class SimResult:
    """Per-request arrays (index = workload request) plus run metadata.

    ``e2e_s`` is inf for requests that never finished (rejected: prompt + output exceed the replica's KV
    capacity; or still running at the hard time cap). ``ttft_s``/``tpot_s`` describe the final tier's
    generation (a cascade's earlier hops are hidden from the user, who waits for the accepted answer).
    """

    arrival_s: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    tier: np.ndarray  # final tier index
    replica: np.ndarray  # replica index that served the final tier (-1: never placed)
    rejected: np.ndarray  # bool
    tiers: tuple[str, ...]
    replica_tier: np.ndarray
    replica_group: np.ndarray
    replica_busy_s: np.ndarray
    replica_served: np.ndarray
    replica_weight: np.ndarray  # what the balancer divided outstanding requests by (capacity, req/s)
    duration_s: float
    cost_per_hour: float
    p95_target_s: float
    capped: bool
    sim_end_s: float
    wall_s: float
    timing_error: float
    #: prompt tokens each request found in its replica's prefix cache (None: the prompts share no prefixes)
    cached_tokens: np.ndarray | None = None
    #: prompt tokens of each request, beside ``cached_tokens``
    prompt_tokens: np.ndarray | None = None
    #: per request, why the affinity rule placed it where it went at its last tier: a position in
    #: :data:`boute.sim.affinity.REASONS`, -1 never placed (None: the plan balances by least load only)
    affinity_reason: np.ndarray | None = None

    @property
    def affinity_routed(self) -> dict[str, int] | None:
        """How many requests each reason of the affinity rule placed (None: least load only)."""
        if self.affinity_reason is None:
            return None
        got = np.bincount(self.affinity_reason[self.affinity_reason >= 0], minlength=len(REASONS))
        return {name: int(got[i]) for i, name in enumerate(REASONS)}

    @property
    def cached_share(self) -> float | None:
        """Share of the completed requests' prompt tokens served from a prefix cache (None: no prefixes)."""
        if self.cached_tokens is None or self.prompt_tokens is None:
            return None
        done = self.completed
        total = float(self.prompt_tokens[done].sum())
        return float(self.cached_tokens[done].sum()) / total if total > 0 else 0.0

    @property
    def completed(self) -> np.ndarray:
        return np.isfinite(self.e2e_s)

    def summary(self) -> dict:
        """Aggregates: latency quantiles over *all* requests (unfinished count as infinitely slow)."""
        n = len(self.e2e_s)
        done = self.completed
        e2e = self.e2e_s
        # completion rate over the last 3/4 of the arrival horizon: skips the warm-up (empty batches) and
        # the drain after arrivals stop, so a stable plan shows ~the offered rate and an overloaded one its
        # capacity
        t0, t1 = 0.25 * self.duration_s, self.duration_s
        finish = self.arrival_s + e2e
        in_window = int(np.count_nonzero((finish >= t0) & (finish <= t1)))
        tiers = {}
        for i, name in enumerate(self.tiers):
            sel = self.tier == i
            tiers[name] = {
                "requests": int(sel.sum()),
                "p95_latency_s": _quantile(e2e[sel], 0.95),
                "mean_ttft_s": float(np.nanmean(self.ttft_s[sel & done])) if (sel & done).any() else float("nan"),
            }
        return {
            "requests": n,
            "completed": int(done.sum()),
            "rejected": int(self.rejected.sum()),
            "capped": self.capped,
            "p50_latency_s": _quantile(e2e, 0.50),
            "p95_latency_s": _quantile(e2e, 0.95),
            "p99_latency_s": _quantile(e2e, 0.99),
            "mean_latency_s": float(e2e[done].mean()) if done.any() else float("nan"),
            "p50_ttft_s": _quantile(np.where(done, self.ttft_s, np.inf), 0.50),
            "p95_ttft_s": _quantile(np.where(done, self.ttft_s, np.inf), 0.95),
            "cached_token_share": self.cached_share,
            "affinity_routed": self.affinity_routed,
            "mean_tpot_s": float(self.tpot_s[done].mean()) if done.any() else float("nan"),
            "throughput_rps": in_window / (t1 - t0) if t1 > t0 else float("nan"),
            "offered_rps": float(n / self.duration_s) if self.duration_s > 0 else float("nan"),
            "slo_attainment": float(np.mean(e2e <= self.p95_target_s)) if n else float("nan"),
            "p95_target_s": self.p95_target_s,
            "cost_per_hour": self.cost_per_hour,
            "tiers": tiers,
            "sim_end_s": self.sim_end_s,
            "wall_s": self.wall_s,
        }
