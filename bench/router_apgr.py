"""Held-out APGR of each router option, for ``bench_router_speed``: the quality side of its goal.

Each option's router is trained on its own embeddings and scored as ``boute router eval`` does, with a
paired bootstrap interval of (option - MiniLM) over the held-out queries and the mean over seeded splits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

PROFILES = {
    "gsm8k": ("builtin:gsm8k", 0.3),
    "mt_bench": ("builtin:mt-bench", 0.5),
    "mt_bench_split30": ("builtin:mt-bench", 0.3),  # the CLI's default split: 48 turns, even noisier
}
PRIMARY = ("gsm8k", "mt_bench")  # the goal is judged on these (MT-Bench: 80 turns, as in bench_quality)
MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
GPT4 = "gpt-4-1106-preview"
TIERS = [MIXTRAL, GPT4]


def apgr(profile: Any, route_all: np.ndarray, test: np.ndarray) -> float:
    from boute.quality.metrics import evaluate
    from boute.quality.policy_quality import QualityModel

    cols = [profile.models.index(m) for m in TIERS]
    qm = QualityModel(("small", "large"), profile.scores[np.ix_(test, cols)], test, route_all)
    return float(evaluate(qm)["summary"]["router"]["apgr"])


def bootstrap_delta(profile: Any, a: np.ndarray, b: np.ndarray, test: np.ndarray, n: int = 300) -> list[float]:
    """95 % interval of APGR(a) - APGR(b) over resampled held-out queries (paired: same resample)."""
    rng = np.random.default_rng(0)
    diffs = []
    for _ in range(n):
        t = np.sort(rng.choice(test, len(test), replace=True))
        try:
            diffs.append(apgr(profile, a, t) - apgr(profile, b, t))
        except Exception:  # a resample with no quality gap between the tiers: skip it
            continue
    return [round(float(np.percentile(diffs, 2.5)), 4), round(float(np.percentile(diffs, 97.5)), 4)]


def held_out_apgr(
    embs: dict[str, dict[str, np.ndarray]], statics: Any, workdir: Path, seeds: list[int]
) -> dict[str, Any]:
    """Per profile and option: seed-0 held-out APGR (MiniLM and static through saved routers and
    ``build_quality_model``, exactly as ``boute router eval``), bootstrap vs MiniLM, mean over seeds."""
    from boute.quality.build import build_quality_model
    from boute.quality.profiles import load_profile
    from boute.quality.router import train_router

    out: dict[str, Any] = {}
    for key, (name, tf) in PROFILES.items():
        prof = load_profile(name)
        res: dict[str, Any] = {"n_test": None, "options": {}}
        route0: dict[str, np.ndarray] = {}
        test0 = None
        for opt, emb in embs[key].items():
            st = statics if opt == "static" else None
            per_seed = []
            for seed in seeds:
                router, _, test = train_router(prof, TIERS, emb, seed=seed, test_fraction=tf, static=st)
                if seed == seeds[0]:
                    test0 = test
                    if opt in ("minilm", "static"):
                        path = router.save(workdir / f"{key}-{opt}.npz")
                        qm = build_quality_model(prof, TIERS, router_path=path)
                        route0[opt] = qm.route_all
                    else:
                        route0[opt] = router.score_embeddings(emb, prof.prompts)
                per_seed.append(apgr(prof, router.score_embeddings(emb, prof.prompts), test))
            res["options"][opt] = {
                "apgr_seed0": round(apgr(prof, route0[opt], test0), 4),
                "apgr_mean_seeds": round(float(np.mean(per_seed)), 4),
                "apgr_sd_seeds": round(float(np.std(per_seed)), 4),
            }
        assert test0 is not None
        res["n_test"] = len(test0)
        base = res["options"]["minilm"]
        for opt, r in res["options"].items():
            r["delta_seed0"] = round(r["apgr_seed0"] - base["apgr_seed0"], 4)
            r["delta_mean_seeds"] = round(r["apgr_mean_seeds"] - base["apgr_mean_seeds"], 4)
            if opt != "minilm":
                r["delta_seed0_95ci"] = bootstrap_delta(prof, route0[opt], route0["minilm"], test0)
        out[key] = res
    return out
