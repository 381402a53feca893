"""Multi-model router vs the 1-D ladder, the best single model, random routing and the oracle (issue 31).

On the RouterBench scenarios (routerbench-3tier, routerbench-4tier; ARC-Challenge), both routers are
trained on the profile's training rows (seeded 70/30 split, as the optimiser's quality model) and their
knobs are the same: N load fractions per tier, cut on the whole profile (thresholds for the ladder, prices
for the multi-model router). Every fraction vector on a simplex grid is one policy; a policy's quality is
the mean score, on held-out queries, of the tier it sends each query to, its cost the mean recorded API
price of those answers (RouterBench's ``total_cost``, USD per query: the data's own price axis, not the
fleet's $/h). Two held-out sets: the profile's 30% (306 queries) and RouterBench's separate test file
(437 queries, never seen by either router or by the thresholds).

Summary per router: APGR = area under the best-reachable PGR vs normalised cost on [0, 1], where
PGR = (quality - q_cheapest) / (q_best_single - q_cheapest) and cost is normalised from the cheapest
tier's to the best single tier's (random mixing of those two scores 0.5); and the least cost reaching each
scenario's floor. Random: the exact expectation of a random split. Oracle: knows every outcome; per query
the cheapest tier among those that answer it best-per-cost for a sweep of cost weights.

Coverage: for a few ladder policies, 2,000 i.i.d. held-out sets of the scenario's size are drawn from the
profile, the bound computed on each as the quality model does; how often the profile-wide quality of the
policy falls below the 95% bound (goal ~5%).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np

TEST_FILE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "routerbench" / "arc_challenge_test.csv"
SCENARIOS = ("routerbench-3tier", "routerbench-4tier")


def _simplex(n: int, step: float) -> list[np.ndarray]:
    k = round(1 / step)
    return [np.array(c, float) / k for c in itertools.product(range(k + 1), repeat=n) if sum(c) == k]


def _envelope(cost: np.ndarray, quality: np.ndarray, c0: float, c1: float, q0: float, q1: float) -> dict[str, Any]:
    """Best-reachable PGR at each normalised cost on a 0..1 grid (a policy costing at most x), and APGR."""
    x = (np.asarray(cost) - c0) / (c1 - c0)
    pgr = (np.asarray(quality) - q0) / (q1 - q0)
    grid = np.linspace(0.0, 1.0, 501)
    env = np.array([pgr[x <= g + 1e-12].max(initial=0.0) for g in grid])
    show = np.linspace(0.0, 1.0, 21)
    return {
        "apgr": float(np.mean(env)),
        "pgr_at_cost": {f"{s:.2f}": float(np.interp(s, grid, env)) for s in show},
    }


def _least_cost(cost: np.ndarray, quality: np.ndarray, floor: float) -> float | None:
    ok = np.asarray(quality) >= floor - 1e-12
    return float(np.asarray(cost)[ok].min()) if ok.any() else None


def _policies(scores: np.ndarray, costs: np.ndarray, tiers: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(cost, quality) of each tier assignment on the held-out rows."""
    rows = np.arange(scores.shape[0])
    q = np.array([scores[rows, t].mean() for t in tiers])
    c = np.array([costs[rows, t].mean() for t in tiers])
    return c, q


def _oracle(scores: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = costs.mean()
    pts = [
        np.argmax(scores - w * costs / scale - 1e-9 * np.arange(scores.shape[1]), axis=1)
        for w in np.geomspace(1e-4, 10, 80)
    ]
    return _policies(scores, costs, pts)


def _compare(name: str, quick: bool) -> dict[str, Any]:
    from boute.quality import quality_model_for
    from boute.quality.build import profile_for, tier_models
    from boute.quality.multi import prices_for_shares, route, train_multi_router
    from boute.quality.profiles import load_profile
    from boute.quality.router import load_router
    from boute.quality.static_embed import load_static
    from boute.specs.scenario import load_scenario

    sc = load_scenario(f"builtin:{name}")
    profile = profile_for(sc)
    models = tier_models(sc, profile)
    qm = quality_model_for(sc)
    test = qm.test_index
    train = np.setdiff1d(np.arange(len(profile)), test)
    cols = [profile.models.index(m) for m in models]
    t0 = time.perf_counter()
    multi = train_multi_router(profile, models, train, load_static())
    train_s = time.perf_counter() - t0
    p_all = multi.predict(profile.prompts)
    ladder = load_router(qm.info["router_path"])
    ext = load_profile(TEST_FILE)
    p_ext, d_ext = multi.predict(ext.prompts), ladder.score(ext.prompts)
    t1 = time.perf_counter()
    for prompt in ext.prompts[:200]:
        multi.predict([prompt])
    multi_us = (time.perf_counter() - t1) / 200 * 1e6
    t1 = time.perf_counter()
    for prompt in ext.prompts[:200]:
        ladder.score_one(prompt)
    ladder_us = (time.perf_counter() - t1) / 200 * 1e6
    tier_of = _tier_of_cost(multi, p_all, d_ext)

    grid = _simplex(len(models), 0.1 if quick or len(models) > 3 else 0.05)
    held = {
        "profile 30% split": (
            profile.scores[np.ix_(test, cols)],
            np.stack([profile.costs[m][test] for m in models], 1),
        ),
        "RouterBench test file": (
            ext.scores[:, [ext.models.index(m) for m in models]],
            np.stack([ext.costs[m] for m in models], 1),
        ),
    }
    out: dict[str, Any] = {
        "tiers": models,
        "floor": sc.targets.quality_floor,
        "n_policies": len(grid),
        "multi_train_s": round(train_s, 2),
        "score_one_us": {"ladder": round(ladder_us, 1), "multi": round(multi_us, 1)},
        "gateway_tier_of_us": tier_of,
        "held_out": {},
    }
    for label, (scores, costs) in held.items():
        ladder_t, multi_t, share_err = [], [], 0.0
        for f in grid:
            lam = prices_for_shares(p_all, f)
            share_err = max(
                share_err, float(np.abs(np.bincount(route(p_all, lam), minlength=len(f)) / len(p_all) - f).max())
            )
            if label.startswith("profile"):
                ladder_t.append(qm.assign(test, f))
                multi_t.append(route(p_all[test], lam))
            else:
                ladder_t.append(np.searchsorted(qm.thresholds_for_fractions(f), d_ext, side="left"))
                multi_t.append(route(p_ext, lam))
        q_t, c_t = scores.mean(axis=0), costs.mean(axis=0)
        cheap, best = int(np.argmin(c_t)), int(np.argmax(q_t))
        curves = {
            "ladder": _policies(scores, costs, ladder_t),
            "multi": _policies(scores, costs, multi_t),
            "random": (np.array([f @ c_t for f in grid]), np.array([f @ q_t for f in grid])),
            "single": (c_t, q_t),
            "oracle": _oracle(scores, costs),
        }
        args = (c_t[cheap], c_t[best], q_t[cheap], q_t[best])
        out["held_out"][label] = {
            "n": int(scores.shape[0]),
            "tier_quality": dict(zip(models, q_t.round(4).tolist(), strict=True)),
            "tier_cost_usd": dict(zip(models, c_t.round(7).tolist(), strict=True)),
            "prices_share_error_max": round(share_err, 4),
            "routers": {
                k: {
                    **_envelope(c, q, *args),
                    "best_quality": float(q.max()),
                    "least_cost_at_floor_usd": _least_cost(c, q, sc.targets.quality_floor),
                }
                for k, (c, q) in curves.items()
            },
        }
    out["coverage"] = _coverage(qm, profile.scores[:, cols], quick)
    return out


def _tier_of_cost(multi: Any, p_all: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """Per-request cost of the gateway's tier map for a multi plan (``boute.quality.router_kinds.PricedScorer.tier_of``:
    difficulty -> argmax_k sigmoid(a_k + b_k d) - lambda_k, after the score it shares with the ladder), against
    the ladder's (a bisect on its thresholds), in microseconds per prompt over the test file's scores."""
    import bisect

    from boute.quality.multi import prices_for_shares
    from boute.quality.router_kinds import PricedScorer

    k = multi.coef.shape[0] if multi.calib is None else multi.calib.shape[0]
    priced = PricedScorer(multi, [float(v) for v in prices_for_shares(p_all, np.full(k, 1.0 / k))])
    cuts = [float(v) for v in np.quantile(scores, np.arange(1, k) / k)]
    out: dict[str, float] = {}
    for name, fn in (("multi", priced.tier_of), ("ladder", lambda d: bisect.bisect_left(cuts, d))):
        times = []
        for d in scores.tolist() * 5:
            t = time.perf_counter()
            fn(d)
            times.append(time.perf_counter() - t)
        out[f"{name}_p50_us"] = round(float(np.median(times)) * 1e6, 2)
        out[f"{name}_p99_us"] = round(float(np.quantile(times, 0.99)) * 1e6, 2)
    return out


def _coverage(qm: Any, scores: np.ndarray, quick: bool) -> dict[str, Any]:
    from boute.quality.policy_quality import QualityModel

    rng = np.random.default_rng(0)
    n_all, n = len(qm.route_all), qm.n_test
    everyone = np.arange(n_all)
    draws = 500 if quick else 2000
    out = {}
    k = len(qm.tiers)
    for f in ([0.3, 0.7] + [0.0] * (k - 2), [0.2] + [0.8 / (k - 1)] * (k - 1), [0.1, 0.3] + [0.6 / (k - 2)] * (k - 2)):
        truth = float(scores[everyone, qm.assign(everyone, f)].mean())
        below, se = 0, []
        for _ in range(draws):
            idx = rng.integers(0, n_all, n)
            r = QualityModel(qm.tiers, scores[idx], idx, qm.route_all).preroute(f)
            below += truth < r.bound
            se.append(r.se)
        out[str([round(v, 3) for v in f])] = {
            "true_quality": round(truth, 4),
            "mean_se": round(float(np.mean(se)), 4),
            "share_below_95pct_bound": below / draws,
            "draws": draws,
            "goal": 0.05,
        }
    return out


def run(quick: bool = False) -> dict[str, Any]:
    if not TEST_FILE.is_file():
        return {"skipped": f"{TEST_FILE} not present"}
    return {
        "cost_axis": "RouterBench recorded API price per answer (USD/query), held-out mean",
        "scenarios": {name: _compare(name, quick) for name in SCENARIOS},
    }
