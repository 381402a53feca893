"""Quality side: embedding throughput, policy evaluations per second, and the router / cascade figures.

Goals (issue 3): embedding cost on CPU measured and batched; one policy on 10k queries well under 1 ms;
on GSM8K held-out queries the learned router beats random clearly (RouteLLM's GSM8K routers: APGR about
0.5-0.6), with the cascade + offline verifier compared at quality floors. Also writes
docs/figures/quality-gsm8k.png.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
GPT4 = "gpt-4-1106-preview"
FIGURE = Path(__file__).resolve().parent.parent / "docs" / "figures" / "quality-gsm8k.png"


def _embedding(quick: bool) -> dict[str, Any]:
    from boute.quality.embed import Embedder
    from boute.quality.profiles import load_profile

    p = load_profile("builtin:gsm8k")
    n = 64 if quick else 256
    t0 = time.perf_counter()
    Embedder().encode(["warm up the model"])
    load_s = time.perf_counter() - t0
    out: dict[str, Any] = {"model_load_s": round(load_s, 2), "n": n}
    for bs in (1, 32) if not quick else (32,):
        e = Embedder(batch_size=bs)
        e.encode(list(p.prompts[:n]))
        out[f"prompts_per_s_batch{bs}"] = round(e.last_stats["texts_per_s"], 1)
    r = Embedder(batch_size=32, max_tokens=128, truncate="left")
    r.encode(list(p.responses[MIXTRAL][:n]))
    out["responses_per_s_batch32_128tok"] = round(r.last_stats["texts_per_s"], 1)
    out["threads"] = e.last_stats["threads"]
    out["first_time_gsm8k_estimate_s"] = round(1319 / out["prompts_per_s_batch32"], 1)
    out["goal"] = "measured and batched (CPU); cached on disk so only the first run on a machine pays"
    return out


def _policy_speed() -> dict[str, Any]:
    from boute.quality.policy_quality import QualityModel

    rng = np.random.default_rng(0)
    res: dict[str, Any] = {"n_test": 10_000, "goal_us": "well under 1000 us per policy"}
    for tiers in (2, 3):
        n = 30_000
        q = (rng.random((n, tiers)) < np.linspace(0.6, 0.9, tiers)).astype(float)
        test = np.sort(rng.choice(n, 10_000, replace=False))
        v = rng.random((n, tiers - 1))
        qm = QualityModel(tuple(map(str, range(tiers))), q[test], test, rng.random(n), cascade_scores=lambda v=v: v)
        fr = rng.dirichlet(np.ones(tiers), size=200)
        for mode in ("preroute", "cascade"):
            fn = qm.preroute if mode == "preroute" else qm.cascade
            fn(fr[0])
            reps = 2000 if (mode == "preroute" or tiers == 2) else 100
            t0 = time.perf_counter()
            for i in range(reps):
                fn(fr[i % 200])
            per = (time.perf_counter() - t0) / reps
            res[f"{mode}_{tiers}tiers_us"] = round(per * 1e6, 1)
            res[f"{mode}_{tiers}tiers_per_s"] = round(1 / per)
    return res


def _gsm8k(seeds: list[int]) -> dict[str, Any]:
    from boute.quality.build import build_quality_model
    from boute.quality.metrics import at_shares, evaluate, share_for_floor
    from boute.quality.profiles import load_profile

    p = load_profile("builtin:gsm8k")
    runs = []
    for seed in seeds:
        qm = build_quality_model(p, [MIXTRAL, GPT4], ["small", "large"], seed=seed)
        res = evaluate(qm, modes=("preroute", "cascade"))
        runs.append((seed, qm, res))
    seed0, qm0, res0 = runs[0]
    summary = {k: {m: _r(v) for m, v in s.items()} for k, s in res0["summary"].items()}
    across = {}
    for name in ("router", "cascade"):
        for metric in ("apgr", "cpt50", "cpt80"):
            vals = [r[2]["summary"][name][metric] for r in runs if r[2]["summary"][name][metric] is not None]
            across[f"{name}_{metric}"] = {
                "mean": _r(float(np.mean(vals))),
                "sd": _r(float(np.std(vals))),
                "n": len(vals),
            }
    floors = {}
    qs, ql = res0["quality_small"], res0["quality_large"]
    for floor in (0.66, 0.69, 0.72, 0.75, 0.80, 0.85):
        row = {}
        for name in ("random", "router", "cascade", "oracle"):
            s = share_for_floor(res0["curves"][name], floor)
            row[name] = _r(s)
        # GPU work per query: preroute runs one generation; the cascade runs the small model on every
        # query plus the large model on the escalated share, and one judge call per query.
        row["router_generations"] = _r(1.0) if row["router"] is not None else None
        row["cascade_generations"] = _r(1.0 + row["cascade"]) if row["cascade"] is not None else None
        winner = [n for n in ("router", "cascade") if row[n] is not None]
        row["fewer_large_calls"] = min(winner, key=lambda n: row[n]) if winner else None
        floors[f"{floor:.2f}"] = row
    _figure(res0)
    return {
        "seed": seed0,
        "n_test": res0["n_test"],
        "quality_small": _r(qs),
        "quality_large": _r(ql),
        "router_test_auc": qm0.info["router_test_auc"],
        "summary_seed0": summary,
        "at_large_share_seed0": {k: {s: _r(v) for s, v in d.items()} for k, d in at_shares(res0).items()},
        "across_seeds": across,
        "seeds": seeds,
        "share_of_large_calls_for_floor": floors,
        "routellm_gsm8k_reference": "best published routers: CPT(50%) ~33-35%, CPT(80%) ~63%, APGR ~0.6 (see docs/quality.md)",
        "figure": str(FIGURE.relative_to(FIGURE.parent.parent.parent)),
    }


def _mtbench() -> dict[str, Any]:
    from boute.quality.build import build_quality_model
    from boute.quality.metrics import evaluate
    from boute.quality.profiles import load_profile

    p = load_profile("builtin:mt-bench")
    qm = build_quality_model(p, [MIXTRAL, GPT4], ["small", "large"], test_fraction=0.5)
    res = evaluate(qm, modes=("preroute", "cascade"))
    return {
        "n_test": res["n_test"],
        "quality_small": _r(res["quality_small"]),
        "quality_large": _r(res["quality_large"]),
        "summary": {k: {m: _r(v) for m, v in s.items()} for k, s in res["summary"].items()},
        "note": "80 held-out turns: a noisy estimate",
    }


def _figure(res: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    style = {"oracle": ("k", ":"), "random": ("0.5", "--"), "router": ("C0", "-"), "cascade": ("C3", "-")}
    label = {"router": "learned router (preroute)", "cascade": "cascade + offline verifier"}
    for name, c in res["curves"].items():
        col, ls = style[name]
        s = res["summary"][name]
        ax.plot(
            np.asarray(c["share"]) * 100,
            c["quality"],
            color=col,
            ls=ls,
            label=f"{label.get(name, name)} (APGR {s['apgr']:.2f})",
        )
    ax.set_xlabel("calls to the large model (GPT-4), % of queries")
    ax.set_ylabel("GSM8K accuracy on held-out queries")
    ax.set_title(f"Mixtral-8x7B -> GPT-4 routing, {res['n_test']} held-out GSM8K queries")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(FIGURE)
    plt.close(fig)


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 4)


def run(quick: bool = False) -> dict[str, Any]:
    return {
        "embedding": _embedding(quick),
        "policy_evaluation": _policy_speed(),
        "gsm8k": _gsm8k([0] if quick else [0, 1, 2, 3, 4]),
        "mt_bench": _mtbench(),
    }
