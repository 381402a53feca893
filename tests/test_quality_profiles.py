"""Quality profile loaders on the real RouteLLM files and on broken ones (errors name file, line, field)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from boute.data import data_path
from boute.errors import SpecError
from boute.quality.profiles import load_profile
from boute.quality.profiles.mtbench_reader import mtbench_prompt_response

MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
GPT4 = "gpt-4-1106-preview"


def test_gsm8k_real_file() -> None:
    p = load_profile("builtin:gsm8k")
    assert len(p) == 1319 and p.format == "routellm-csv"
    assert p.models == (MIXTRAL, GPT4)
    assert p.scale == (0.0, 1.0)
    # the data README's figures: Mixtral right on 63.8%, GPT-4 on 85.7%, 383 only-GPT-4, 95 only-Mixtral
    q = p.mean_quality()
    assert round(q[MIXTRAL], 3) == 0.638 and round(q[GPT4], 3) == 0.857
    s, large = p.column(MIXTRAL), p.column(GPT4)
    assert int(((large == 1) & (s == 0)).sum()) == 383 and int(((s == 1) & (large == 0)).sum()) == 95
    assert set(p.responses) == {MIXTRAL, GPT4} and len(p.responses[GPT4]) == 1319
    assert p.prompts[0].startswith("Janet")


def test_mtbench_real_file() -> None:
    path = data_path("builtin:mt-bench")
    p = load_profile("builtin:mt-bench")
    assert len(p) == 160 and p.scale == (1.0, 10.0) and set(p.models) == {MIXTRAL, GPT4}
    assert p.scores.min() >= 0 and p.scores.max() <= 1
    raw = {}
    for line in path.read_text().splitlines():
        o = json.loads(line)
        raw[(f"{o['question_id']}/{o['turn']}", o["model"])] = float(o["score"])
    for i, qid in enumerate(p.query_ids):  # normalised back to the file's 1-10 scores, exactly
        for j, m in enumerate(p.models):
            assert p.to_raw(p.scores[i, j]) == pytest.approx(raw[(qid, m)])
    turn2 = [i for i, q in enumerate(p.query_ids) if q.endswith("/2")]
    assert len(turn2) == 80
    first = p.query_ids.index(p.query_ids[turn2[0]].replace("/2", "/1"))
    assert p.prompts[turn2[0]].startswith(p.prompts[first])  # turn 2 carries the first question as context
    assert "[Instruction]" not in "".join(p.prompts) and "### User" not in "".join(p.prompts)
    assert all(r.strip() for r in p.responses[MIXTRAL])


def test_mtbench_extraction_of_both_turns() -> None:
    up = (
        "<|The Start of Assistant A's Conversation with User|>\n\n### User:\nQ one?\n\n### Assistant A:\nA one.\n\n"
        "### User:\nQ two?\n\n### Assistant A:\nA two.\n\n<|The End of Assistant A's Conversation with User|>"
    )
    assert mtbench_prompt_response(up, 2) == ("Q one?\n\nQ two?", "A two.")
    single = "[Instruction]\nx\n\n[Question]\nWhat?\n\n[The Start of Assistant's Answer]\nThis.\n[The End of Assistant's Answer]"
    assert mtbench_prompt_response(single, 1) == ("What?", "This.")


def test_plain_jsonl(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    rows = [
        {"prompt": "a", "scores": {"s": 3, "l": 9}, "responses": {"s": "x", "l": "y"}},
        {"prompt": "b", "scores": {"s": 10, "l": 1}, "responses": {"s": "x2", "l": "y2"}},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    p = load_profile(f)
    assert p.format == "jsonl" and p.scale == (1.0, 10.0) and p.models == ("s", "l")
    np.testing.assert_allclose(p.scores, [[2 / 9, 8 / 9], [1.0, 0.0]])
    assert p.responses["l"] == ("y", "y2")
    p2 = load_profile(f, scale=(0, 10))
    np.testing.assert_allclose(p2.scores[0], [0.3, 0.9])


def _csv(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return path


def _err(path: Path | str, **kw: object) -> str:
    with pytest.raises(SpecError) as exc:
        load_profile(path, **kw)  # type: ignore[arg-type]
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_broken_csv(tmp_path: Path) -> None:
    f = _csv(tmp_path / "bad.csv", [["prompt", "small", "large"], ["q1", "True", "False"], ["q2", "maybe", "True"]])
    msg = _err(f)
    assert "bad.csv" in msg and "line 3" in msg and "'small'" in msg and "maybe" in msg
    f = _csv(tmp_path / "noprompt.csv", [["question", "small"], ["q", "True"]])
    assert "no 'prompt' column" in _err(f)
    f = _csv(tmp_path / "ragged.csv", [["prompt", "a", "b"], ["q", "1"]])
    assert "line 2" in _err(f) and "columns" in _err(f)
    f = _csv(tmp_path / "scale.csv", [["prompt", "a", "b"], ["q", "250", "3"]])
    assert "not a known scale" in _err(f)
    f = _csv(tmp_path / "empty_prompt.csv", [["prompt", "a"], ["  ", "1"]])
    assert "field 'prompt'" in _err(f)
    assert "not found" in _err(tmp_path / "missing.csv")


def test_broken_mtbench(tmp_path: Path) -> None:
    good = {"question_id": 1, "model": "a", "turn": 1, "score": 7, "user_prompt": "[Question]\nq\n\n[The Start of x"}
    f = tmp_path / "mt.jsonl"
    f.write_text(json.dumps(good) + "\n" + json.dumps({k: v for k, v in good.items() if k != "score"}) + "\n")
    msg = _err(f)
    assert "mt.jsonl" in msg and "line 2" in msg and "'score'" in msg
    f.write_text(json.dumps(good) + "\n{not json\n")
    assert "line 2" in _err(f) and "malformed JSON" in _err(f)
    f.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    assert "second judgement" in _err(f)
    f.write_text(json.dumps(good) + "\n" + json.dumps({**good, "model": "b", "question_id": 2}) + "\n")
    assert "question 1 turn 1 has no score for b" in _err(f)
    f.write_text(json.dumps({**good, "turn": "first"}) + "\n")
    assert "'turn'" in _err(f)
    f.write_text(json.dumps({**good, "score": -1}) + "\n")
    assert "no valid judge score" in _err(f)


def test_broken_plain_jsonl(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"prompt": "a", "scores": {"s": 1, "l": 0}})
        + "\n"
        + json.dumps({"prompt": "b", "scores": {"s": 1}})
        + "\n"
    )
    msg = _err(f)
    assert "p.jsonl" in msg and "line 2" in msg and "'scores'" in msg
    f.write_text(json.dumps({"scores": {"s": 1}}) + "\n")
    assert "line 1" in _err(f) and "'prompt'" in _err(f)
    f.write_text(json.dumps({"prompt": "a", "scores": {"s": "high"}}) + "\n")
    assert "scores.s" in _err(f)
    assert "unknown profile format" in _err(f, format="xml")


# ------------------------------------------------------------------------------------------ RouterBench
ROUTERBENCH = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "routerbench"
needs_routerbench = pytest.mark.skipif(
    not (ROUTERBENCH / "arc_challenge_train.csv").is_file(), reason="../shared/data/routerbench/ not present"
)
OPEN = {
    "mistralai/mistral-7b-chat": 0.670,
    "WizardLM/WizardLM-13B-V1.2": 0.659,
    "mistralai/mixtral-8x7b-chat": 0.854,
    "meta/llama-2-70b-chat": 0.803,
    "zero-one-ai/Yi-34B-Chat": 0.903,
}


@needs_routerbench
def test_routerbench_real_files() -> None:
    train, test = (load_profile(ROUTERBENCH / f"arc_challenge_{s}.csv") for s in ("train", "test"))
    assert train.format == test.format == "routerbench" and len(train.models) == 11
    # every blank-scored row is left out and named: 20 of 1,039 train rows, 8 of 445 test rows
    assert (len(train), len(train.dropped), len(test), len(test.dropped)) == (1019, 20, 437, 8)
    assert all(q.startswith("arc-challenge.") for q in train.query_ids + train.dropped)
    # the data README's accuracies over both files (within the 28 left-out rows' weight)
    for m, acc in OPEN.items():
        both = np.concatenate([train.column(m), test.column(m)])
        assert abs(both.mean() - acc) < 0.005, (m, both.mean())
    # prompts are the list literal's text, answers the responses' text, costs USD per answer
    assert not train.prompts[0].startswith("['") and train.prompts[0].rstrip().endswith("Answer:")
    assert set(train.responses) == set(train.models) and train.responses[train.models[0]][0] in "ABCD"
    assert all(np.isfinite(c).all() and (c > 0).all() for c in train.costs.values())
    assert train.costs["gpt-4-1106-preview"].mean() > 10 * train.costs["mistralai/mistral-7b-chat"].mean()


def _rb_rows(extra: list[list[str]] | None = None) -> list[list[str]]:
    head = [
        "",
        "sample_id",
        "prompt",
        "eval_name",
        "a",
        "b",
        "a|model_response",
        "b|model_response",
        "a|total_cost",
        "b|total_cost",
    ]
    rows = [
        ["0", "s.1", "['Q one?\\nAnswer:']", "x", "1.0", "0.0", "['A\\n']", "['B\\n']", "1e-4", "2e-3"],
        ["1", "s.2", "['Q two?', 'Q two?']", "x", "", "1.0", "['C']", "['D']", "1e-4", "2e-3"],
        ["2", "s.3", "['Q three?']", "x", "0.0", "1.0", "['C']", "['D']", "1e-4", "2e-3"],
    ]
    return [head, *rows, *(extra or [])]


def test_routerbench_format_blanks_and_errors(tmp_path: Path) -> None:
    f = _csv(tmp_path / "rb.csv", _rb_rows())
    p = load_profile(f)
    assert p.format == "routerbench" and p.models == ("a", "b") and p.query_ids == ("s.1", "s.3")
    assert p.dropped == ("s.2",) and p.prompts == ("Q one?\nAnswer:", "Q three?")
    assert p.responses == {"a": ("A\n", "C"), "b": ("B\n", "D")}
    np.testing.assert_allclose(p.costs["b"], [2e-3, 2e-3])
    bad = _rb_rows([["3", "s.4", "Q four, not a list", "x", "1.0", "1.0", "['A']", "['B']", "1e-4", "2e-3"]])
    msg = _err(_csv(tmp_path / "lit.csv", bad))
    assert "lit.csv" in msg and "line 5" in msg and "'prompt'" in msg and "list literal" in msg
    bad = _rb_rows([["3", "s.4", "['q']", "x", "1.0", "1.0", "['A']", "['B']", "-1", "2e-3"]])
    msg = _err(_csv(tmp_path / "cost.csv", bad))
    assert "line 5" in msg and "a|total_cost" in msg and "negative" in msg
    bad = _rb_rows([["3", "s.4", "['q']", "x", "1.0", "yes-ish", "['A']", "['B']", "1e-4", "2e-3"]])
    msg = _err(_csv(tmp_path / "score.csv", bad))
    assert "line 5" in msg and "'b'" in msg and "yes-ish" in msg
    rows = _rb_rows()
    rows[0] = [*rows[0][:-1], "c|total_cost"]
    msg = _err(_csv(tmp_path / "orphan.csv", rows))
    assert "line 1" in msg and "c|total_cost" in msg and "no score column" in msg
    rows = [r[:4] + [""] * 6 if i else r for i, r in enumerate(_rb_rows())]
    assert "no data rows" in _err(_csv(tmp_path / "blank.csv", rows), format="routerbench")


@needs_routerbench
def test_one_reader_feeds_quality_and_workload(tmp_path: Path) -> None:
    """Row i of the workload's lengths is row i of the quality profile, for each format (issue 31)."""
    from boute.workload.profiles import profile_lengths
    from boute.workload.tokens import count_tokens

    f = ROUTERBENCH / "arc_challenge_test.csv"
    p, lengths = load_profile(f), profile_lengths(str(f), "auto", ("mistralai/mistral-7b-chat",))
    assert len(lengths.input_tokens) == len(p)
    np.testing.assert_array_equal(lengths.input_tokens[:5], count_tokens(list(p.prompts[:5])))
    # the documented plain JSONL ({"responses": {model: text}}) gives output lengths (it did not: issue 31)
    j = tmp_path / "p.jsonl"
    rows = [
        {"prompt": f"question {i}?", "scores": {"s": i % 2, "l": 1}, "responses": {"s": "a b c " * i, "l": "x"}}
        for i in range(1, 5)
    ]
    j.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = profile_lengths(str(j), "auto", ("s",))
    assert got.models == ("s",) and list(got.output_tokens) == list(count_tokens([r["responses"]["s"] for r in rows]))
