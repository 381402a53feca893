"""`boute verify` on traffic whose prompts share prefixes: the replay sends the system prompts and earlier turns
the simulator counted (boute/serving/replay_requests.py: prefixed_messages), and the replicas' reported cached tokens
are judged against the plan's promised cached share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from boute.errors import BouteError
from boute.quality import quality_model_for
from boute.quality.build import profile_for, tier_models
from boute.serving.replay_requests import build_requests
from boute.specs import load_scenario
from boute.workload import replay_workload
from boute.workload.tokens import count_tokens

SCENARIO = "builtin:shared-system-prompt"


def test_the_replay_carries_system_prompts_and_earlier_turns_as_simulated() -> None:
    sc = load_scenario(SCENARIO)
    qm, profile = quality_model_for(sc), profile_for(sc)
    tiers = np.random.default_rng(0).integers(0, 2, size=100_000)  # any routing: whose answers turn 2 repeats
    req = build_requests(sc, profile, qm.test_index, duration_s=20, assign=lambda rows: tiers[: len(rows)])
    w = replay_workload(sc, qm.test_index, duration_s=20)
    p = w.prefixes
    assert p is not None and len(req.bodies) == len(w)
    models = tier_models(sc, profile)
    chats = [json.loads(b)["messages"] for b in req.bodies]
    later = 0
    for i, chat in enumerate(chats):
        root = int(p.prompt_node[i])
        while p.parent[root] >= 0:
            root = int(p.parent[root])
        assert chat[0]["role"] == "system" and count_tokens([chat[0]["content"]])[0] == p.tokens[root]
        assert chat[-1] == {"role": "user", "content": profile.prompts[int(req.rows[i])]}
        prev = p.previous(i)
        if prev >= 0:  # turn 2: turn 1's chat, the answer its tier gave, then its own prompt
            later += 1
            answer = profile.responses[models[int(tiers[prev])]][int(req.rows[prev])]
            assert chat[: len(chats[prev]) + 1] == [*chats[prev], {"role": "assistant", "content": answer}]
    assert later > len(chats) // 10
    # the same system prompt is the same text wherever it recurs, another one is other text
    systems = {int(p.parent[int(p.prompt_node[i])]): chats[i][0]["content"] for i in range(len(w)) if p.turn[i] == 1}
    assert len(set(systems.values())) == len(systems) > 1
    with pytest.raises(BouteError, match="conversations"):
        build_requests(sc, profile, qm.test_index, duration_s=5)  # no routing: whose answers is unknown


@pytest.mark.slow
@pytest.mark.timeout(300)  # an optimisation, then one verify run (20 s of traffic at speedup 8) as processes
def test_a_plan_for_shared_prefixes_serves_its_promised_cached_share(tmp_path: Path) -> None:
    def boute(*argv: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "boute", *argv]
        return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False)

    r = boute("optimize", "--scenario", SCENARIO, "--max-evals", "12", "--out", "plan.json", "-q")
    assert r.returncode == 0, r.stderr
    promised = json.loads((tmp_path / "plan.json").read_text())["predicted"]["cached_token_share"]
    assert promised > 0.5
    r = boute("verify", "--plan", "plan.json", "--duration", "20", "--speedup", "8", "--stream-share", "0.2", "--json")
    assert r.returncode in (0, 1), r.stderr  # 1: a check outside tolerance (small samples), still a verdict
    out = json.loads(r.stdout)
    m = out["measured"]
    assert m["failed"] == 0 and m["answers_match_profile"] == 1.0  # streamed answers read whole, too
    check = next(c for c in out["checks"] if c["name"] == "cached token share")
    assert check["promised"] == promised and check["ok"], check
    # the streamed sample's time to first token, beside the simulator's, and never after the answer ends
    ttft = {c["name"]: c for c in out["checks"] if c["name"].startswith("TTFT")}
    assert set(ttft) == {"TTFT P50 (s)", "TTFT P95 (s)"} and all(c["promised"] > 0 for c in ttft.values())
    assert 0 < m["ttft_p50_s"] <= m["ttft_p95_s"] <= m["p95_s"]
