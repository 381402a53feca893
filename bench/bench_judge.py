"""The cascade judge's cost per answer on one core and its held-out AUC, per embedder (issue 29, item 2).

Goal: p50 <= 1 ms and p99 <= 3 ms per answer on one core (the gateway judges every non-final hop), with
held-out AUC no worse than the MiniLM verifier's. Options: the verifier on MiniLM embeddings (``minilm``,
the previous judge) and on the router's static, model2vec-distilled token vectors (``static``, the default
now), each trained on the seed-0 split's training rows of the profile's judged (small) tier, exactly as the
quality model trains it (:func:`boute.quality.build.verifier_scores`), and scored on the held-out rows.

Speed: the process pinned to one core, torch one thread; each held-out answer scored alone through
:meth:`OfflineVerifier.score` (what one judge call costs: embedding both texts + the linear head), wall and
CPU time per answer, and in batches of 8 (what :class:`VerifierJudge` does under load: the batch's time over
its size). Rounds interleave the options so load from other jobs hits them alike.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

GOAL = {"p50_ms": 1.0, "p99_ms": 3.0}
PROFILES = {"gsm8k": "builtin:gsm8k", "mt_bench": "builtin:mt-bench"}
EMBEDDERS = ("minilm", "static")


def _pin() -> None:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import torch

    torch.set_num_threads(1)


def _verifier(profile: Any, model: str, train: np.ndarray, embedder: str) -> Any:
    from boute.quality.embed import Embedder
    from boute.quality.judges import RESPONSE_EMBED, response_tail, train_verifier
    from boute.quality.static_embed import load_static

    responses = list(profile.responses[model])
    static = load_static() if embedder == "static" else None
    if static is not None:
        pe, re_ = static.embed(profile.prompts), static.embed([response_tail(r) for r in responses])
    else:
        pe, re_ = Embedder().embed(profile.prompts), Embedder(**RESPONSE_EMBED).embed(responses)
    labels = {model: profile.column(model)}
    return train_verifier(profile.prompts, pe, {model: responses}, {model: re_}, labels, train, seed=0, static=static)


def _ms(values: list[float]) -> dict[str, float]:
    from boute.stats import quantile

    a = np.asarray(values) * 1e3
    return {
        "p50_ms": round(quantile(a, 0.5), 3),
        "p99_ms": round(quantile(a, 0.99), 3),
        "mean_ms": round(float(a.mean()), 3),
    }


def run(quick: bool = False) -> dict[str, Any]:
    from boute.quality import load_profile
    from boute.quality.router import _auc, split_indices

    _pin()
    n_time = 100 if quick else 400
    out: dict[str, Any] = {"goal": GOAL, "profiles": {}}
    for name, ref in PROFILES.items():
        profile = load_profile(ref)
        answered = [m for m in profile.models if m in profile.responses]
        model = min(answered, key=lambda m: float(profile.column(m).mean()))  # the judged (small) tier
        train, test = split_indices(len(profile), 0.3, 0)
        good = profile.column(model)[test] >= 0.5
        prompts, answers = list(profile.prompts), list(profile.responses[model])
        verifiers = {e: _verifier(profile, model, train, e) for e in EMBEDDERS}
        row: dict[str, Any] = {"judged_model": model, "n_train": int(len(train)), "n_test": int(len(test))}
        for e, v in verifiers.items():
            s = v.score([prompts[i] for i in test], [answers[i] for i in test], cache=False)
            row[e] = {"held_out_auc": round(float(_auc(s, good) or float("nan")), 4)}
            v.score(["warm"], ["up"], cache=False)
        timed = [int(i) for i in test[:n_time]]
        walls: dict[str, list[float]] = {e: [] for e in EMBEDDERS}
        cpus: dict[str, list[float]] = {e: [] for e in EMBEDDERS}
        batch: dict[str, list[float]] = {e: [] for e in EMBEDDERS}
        for k, i in enumerate(timed):  # interleaved: each answer through every option in turn
            for e, v in verifiers.items():
                t0, c0 = time.perf_counter(), time.process_time()
                v.score([prompts[i]], [answers[i]], cache=False)
                walls[e].append(time.perf_counter() - t0)
                cpus[e].append(time.process_time() - c0)
                if k % 8 == 0 and k + 8 <= len(timed):
                    group = timed[k : k + 8]
                    t0 = time.perf_counter()
                    v.score([prompts[j] for j in group], [answers[j] for j in group], cache=False)
                    batch[e].append((time.perf_counter() - t0) / 8)
        for e in EMBEDDERS:
            row[e] |= {"alone_wall": _ms(walls[e]), "alone_cpu": _ms(cpus[e]), "batch8_wall_per_answer": _ms(batch[e])}
            row[e]["meets_goal"] = bool(
                row[e]["alone_wall"]["p50_ms"] <= GOAL["p50_ms"] and row[e]["alone_wall"]["p99_ms"] <= GOAL["p99_ms"]
            )
        row["auc_static_minus_minilm"] = round(row["static"]["held_out_auc"] - row["minilm"]["held_out_auc"], 4)
        out["profiles"][name] = row
        print(f"[judge] {name}: {row}", flush=True)
    out["load_avg"] = round(os.getloadavg()[0], 2)
    return out
