"""MT-Bench as recorded two-turn conversations (issue 51 item 2): a conversation opens on a question's turn 1 and
its next request asks that question's recorded turn 2 after the answer its client got; the quality model's
train/test split keeps both turns of a question on one side (boute/quality/router.py: split_indices)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from boute.quality import quality_model_for
from boute.quality.build import profile_for, tier_models
from boute.quality.profiles import load_profile
from boute.quality.router import profile_split, split_indices
from boute.serving.replay_requests import build_requests
from boute.specs import load_scenario
from boute.workload import build_workload, replay_workload
from boute.workload.profiles import profile_lengths
from boute.workload.tokens import count_tokens
from tests.prefixed import with_prefixes

SCENARIO = "builtin:mtbench-conversations"


def test_the_profile_records_which_turn_follows_which() -> None:
    prof = load_profile("builtin:mt-bench")
    ids = prof.query_ids
    for row, prev in enumerate(prof.follows):
        q, t = ids[row].split("/")
        if t == "1":
            assert prev == -1
        else:  # the same question's previous turn
            assert ids[prev] == f"{q}/{int(t) - 1}" and prof.continues(row, prev) and not prof.continues(prev, row)
    nxt = prof.next_turns()
    assert all(prof.follows[int(nxt[r])] == r for r in np.flatnonzero(nxt >= 0))
    assert load_profile("builtin:gsm8k").conversation_groups() is None  # queries that stand alone


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_split_keeps_a_conversations_turns_on_one_side(seed: int) -> None:
    prof = load_profile("builtin:mt-bench")
    groups = prof.conversation_groups()
    assert groups is not None
    frac = float(np.random.default_rng(seed).uniform(0.1, 0.6))
    train, test = profile_split(prof, frac, seed)
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(len(prof)))
    assert not set(groups[train]) & set(groups[test])  # no question's text on both sides
    assert round(len(prof) * frac) <= len(test) <= round(len(prof) * frac) + 1  # whole groups of two
    gsm = load_profile("builtin:gsm8k")  # without recorded conversations: the split by query, as before
    for a, b in zip(profile_split(gsm, frac, seed), split_indices(len(gsm), frac, seed), strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_turn_two_asks_its_own_questions_recorded_turn_two(seed: int) -> None:
    sc = with_prefixes(load_scenario(SCENARIO), {"conversations": {"turns": 2, "think_s": 20}}, seed=seed)
    prof = load_profile("builtin:mt-bench")
    lengths = profile_lengths("builtin:mt-bench", "auto", tuple(tier_models(sc, prof)))
    assert lengths.own_input_tokens is not None
    w = build_workload(sc, duration_s=30)
    p = w.prefixes
    assert p is not None
    rows = w.prompt_index
    first, second = np.flatnonzero(p.turn == 1), np.flatnonzero(p.turn == 2)
    assert len(second) > len(w) // 5
    assert all(prof.follows[int(rows[i])] == -1 for i in first)  # conversations open on a turn 1
    for i in second:
        prev = p.previous(int(i))
        assert prof.continues(int(rows[i]), int(rows[prev]))
        # the prompt: turn 1's prompt, the answer, then the recorded turn 2's own prompt (not its full context)
        assert w.input_tokens[i] == w.input_tokens[prev] + w.output_tokens[prev] + lengths.own_input_tokens[rows[i]]
        assert w.output_tokens[i] == lengths.output_tokens[rows[i]]  # turn 2's own answer length
    # a third turn has no recorded question: it asks the question its request drew (a turn 1), after the history
    three = build_workload(with_prefixes(sc, {"conversations": {"turns": 3, "think_s": 5}}), duration_s=30)
    p3 = three.prefixes
    assert p3 is not None and (p3.turn == 3).any()
    assert all(prof.follows[int(three.prompt_index[i])] == -1 for i in np.flatnonzero(p3.turn == 3))


def test_the_replay_sends_turn_two_after_turn_one_and_its_answer() -> None:
    sc = load_scenario(SCENARIO)
    qm, profile = quality_model_for(sc), profile_for(sc)
    groups = profile.conversation_groups()
    train = np.setdiff1d(np.arange(len(profile)), qm.test_index)
    assert groups is not None and set(groups[qm.test_index]).isdisjoint(groups[train])
    tiers = np.random.default_rng(5).integers(0, 2, size=100_000)
    req = build_requests(sc, profile, qm.test_index, duration_s=40, assign=lambda rows: tiers[: len(rows)])
    w = replay_workload(sc, qm.test_index, duration_s=40)
    p = w.prefixes
    assert p is not None and np.array_equal(req.rows, w.prompt_index)
    models = tier_models(sc, profile)
    chats = [json.loads(b)["messages"] for b in req.bodies]
    later = 0
    for i, chat in enumerate(chats):
        r = int(req.rows[i])
        prev = p.previous(i)
        if prev < 0:
            assert chat == [{"role": "user", "content": profile.prompts[r]}]  # a turn 1: its question alone
            continue
        later += 1
        answer = profile.responses[models[int(tiers[prev])]][int(req.rows[prev])]
        assert chat == [
            *chats[prev],
            {"role": "assistant", "content": answer},
            {"role": "user", "content": profile.prompts[r]},
        ]
        # what the replica prefills is what the simulator counted, but for the answer: the simulator's is the
        # mean of the tiers' recorded lengths, the replica gets the one tier's
        sent = sum(count_tokens([m["content"] for m in chat]))
        mean_answer, own = int(w.output_tokens[prev]), int(count_tokens([answer])[0])
        assert sent - own == w.input_tokens[i] - mean_answer
    assert later > len(chats) // 5
