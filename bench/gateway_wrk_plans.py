"""The plans ``bench_gateway_wrk`` serves: two tiers on H100s, pre-routed by the learned router or by prompt
length, or a cascade judged by the optimiser's verifier; and the learned router they use, trained once and
cached.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.gateway_wrk_load import MAX_TOKENS
from tests.stack import Stack


def plan_dict(router: Path) -> dict[str, Any]:
    """Two tiers, learned scorer, half the GSM8K reference to each: every request is scored. The router's
    files are the plan's artifacts (copied beside the plan by :func:`copy_router`, hashes checked on load)."""
    from boute.quality.router import load_router
    from boute.specs.io import sha256_file

    files = load_router(router).files()
    plan = plan_dict_base()
    plan["routing"].update(scorer="learned", router=router.name)
    plan["artifacts"] = [{"path": f.name, "sha256": sha256_file(f)} for f in files]
    return plan


def plan_dict_base() -> dict[str, Any]:
    """Two tiers on H100s, half the load each; the scorer is set by the callers."""
    return {
        "scenario": "builtin:paper-gsm8k",
        "routing": {
            "mode": "preroute",
            "tiers": ["small", "large"],
            "fractions": [0.5, 0.5],
            "reference": "builtin:gsm8k",
        },
        "deployment": [
            {"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 1},
            {"tier": "large", "model": "llama-3.1-70b", "gpu": "h100-sxm", "count": 1, "tp": 4},
        ],
    }


def length_plan_dict() -> dict[str, Any]:
    """The same plan with ``routing.scorer: length`` (prompt-length CDF): the gateway without a model."""
    plan = plan_dict_base()
    plan["routing"].update(scorer="length")
    return plan


def cascade_verifier() -> Path:
    """The static verifier the optimiser scores paper-gsm8k cascades with (its quality model's, trained once
    and cached): the file a cascade plan from ``boute optimize --mode cascade`` would bundle."""
    from boute.optimize.evaluators.base import verifier_of
    from boute.quality.build import quality_model_for
    from boute.specs import load_scenario

    model = quality_model_for(load_scenario("builtin:paper-gsm8k"))
    assert model.cascade_scores is not None  # two tiers: a cascade model
    model.cascade_scores()  # trains and saves the verifier unless a cached one is there
    path = verifier_of(model)
    assert path is not None
    return Path(path)


def half_threshold(stack: Stack, verifier: Path, prompts: list[str]) -> float:
    """The verifier score that escalates half of ``prompts``: the median of its scores on the answers tier 0's
    replica gives them (its own responder, at ``MAX_TOKENS``), i.e. the texts the gateway's judge will read."""
    from backends.emulated.launch import replica_configs
    from backends.emulated.profile import Responder
    from boute.quality.judges import load_verifier
    from boute.specs import load_scenario

    small = replica_configs(stack.plan, load_scenario(None))[0]  # the plan lists tier 0's replica first
    responder = Responder(small)
    answers = ["".join(responder.answer(p, MAX_TOKENS)[0]) for p in prompts]
    return float(np.median(load_verifier(verifier).score(prompts, answers)))


def write_cascade_plan(stack: Stack, out: Path) -> float:
    """The bench plan's two replicas as a verifier-judged cascade, bundled beside ``out``; returns its
    threshold (:func:`half_threshold`)."""
    from boute.quality.judges import verifier_files
    from boute.quality.profiles import load_profile
    from boute.serving.bundle import write_plan
    from boute.specs import load_scenario
    from boute.specs.plan import Plan

    verifier = cascade_verifier()
    threshold = half_threshold(stack, verifier, list(load_profile("builtin:gsm8k").prompts))
    plan = plan_dict_base()
    plan["routing"] = {
        "mode": "cascade",
        "tiers": ["small", "large"],
        "fractions": [0.5, 0.5],
        "judge": "verifier",
        "verifier": verifier.name,
        "thresholds": [threshold],
    }
    scenario = load_scenario("builtin:paper-gsm8k")
    write_plan(Plan.model_validate(plan), out, scenario, verifier_files=verifier_files(verifier))
    return threshold


def learned_router() -> Path:
    """A static-embedding router trained on builtin:gsm8k, trained once and cached (training distils the
    embedding table on first use: minutes; later: seconds)."""
    from boute.data import cache_dir as default_cache_dir

    out = default_cache_dir() / "bench" / "gateway_wrk" / "router.npz"
    if not (out.is_file() and Path(str(out) + ".json").is_file()):
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "boute.cli.main",
            "router",
            "train",
            "--profile",
            "builtin:gsm8k",
            "--out",
            str(out),
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def copy_router(src: Path, dest_dir: Path) -> None:
    """Copy the router's files beside the plan (a plan's router path is relative to its folder)."""
    from boute.quality.router import load_router

    for f in load_router(src).files():
        shutil.copy2(f, dest_dir / f.name)
