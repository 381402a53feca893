"""The RouterBench built-in scenarios: tiers deploy the models their quality columns measured (issue 31)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from boute.quality import quality_model_for
from boute.quality.build import profile_for, tier_models
from boute.specs.scenario import load_scenario
from boute.workload import build_workload

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "routerbench" / "arc_challenge_train.csv"
pytestmark = pytest.mark.skipif(not DATA.is_file(), reason="../shared/data/routerbench/ not present")

#: profile column -> catalog model that a tier of that column deploys
DEPLOYS = {
    "mistralai/mistral-7b-chat": "mistral-7b-v0.2",
    "mistralai/mixtral-8x7b-chat": "mixtral-8x7b",
    "zero-one-ai/Yi-34B-Chat": "yi-34b",
    "meta/llama-2-70b-chat": "llama-2-70b",
}


@pytest.mark.parametrize("name,n", [("routerbench-3tier", 3), ("routerbench-4tier", 4)])
def test_tiers_deploy_the_measured_models(name: str, n: int) -> None:
    sc = load_scenario(f"builtin:{name}")
    profile = profile_for(sc)
    cols = tier_models(sc, profile)
    assert len(sc.tiers) == n and len(set(cols)) == n  # no column reused for two tiers
    assert all(DEPLOYS[c] == t.model for c, t in zip(cols, sc.tiers, strict=True))
    assert all(g in sc.catalog.gpus for g in sc.cluster.gpus)
    qm = quality_model_for(sc)
    # quality is not ordered by size: the 70B tier is below Mixtral on the held-out queries
    assert qm.tier_quality[-1] < qm.tier_quality[1]
    w = build_workload(sc, duration_s=5.0)
    assert w.prompt_index.max() < len(profile) and (w.input_tokens > 100).all()


def test_the_stand_in_scenario_says_so() -> None:
    sc = load_scenario("builtin:three-tier-mix")
    assert "STAND-IN" in sc.description
    cols = [t.quality_model for t in sc.tiers]
    assert len(set(cols)) < len(cols)  # what makes it a stand-in
    assert np.isfinite(quality_model_for(sc).tier_quality).all()
