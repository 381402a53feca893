"""Cascade judges: the verifier the optimiser scores with is the one the gateway runs, to the same score."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from boute.quality.judges import VerifierJudge, load_verifier, train_verifier, verifier_files


class _Counting:
    """A stand-in verifier that records its calls: score = len(response) / 100, 'bad' answers raise."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def score(self, prompts: list[str], responses: list[str], *, cache: bool | None = None) -> np.ndarray:
        assert cache is False  # serving never writes the embedding cache
        self.calls.append(len(prompts))
        if "bad" in responses:
            raise ValueError("cannot embed")
        return np.array([len(r) / 100 for r in responses])


async def test_answers_arriving_together_are_scored_in_one_batch_and_a_bad_one_fails_alone() -> None:
    fake = _Counting()
    judge = VerifierJudge(fake)  # type: ignore[arg-type]
    first = await judge.ajudge("q", "x" * 10)
    answers = ["y" * n for n in range(1, 9)] + ["bad"]
    scores = await asyncio.gather(*(judge.ajudge("q", a) for a in answers))
    assert first == pytest.approx(0.10)
    assert scores[:-1] == pytest.approx([n / 100 for n in range(1, 9)]) and scores[-1] == 0.0
    # one call for the first answer, one for the nine that queued together (failed), then one per answer
    assert fake.calls[:2] == [1, 9] and len(fake.calls) == 2 + 9
    assert judge.failures == 1 and judge.last_error is not None and "cannot embed" in judge.last_error


@pytest.mark.parametrize("embedder", ["static", "minilm"])
def test_the_gateway_scores_an_answer_as_the_optimiser_did(tmp_path: Path, embedder: str) -> None:
    """A verifier trained on real GSM8K answers, saved as a plan bundles it and loaded as the gateway does:
    one answer at a time through the judge gives the offline (batched, cached) score to 1e-6."""
    from boute.quality import load_profile
    from boute.quality.embed import Embedder
    from boute.quality.judges import RESPONSE_EMBED, response_tail
    from boute.quality.static_embed import load_static

    profile = load_profile("builtin:gsm8k")
    model = next(m for m in profile.models if m in profile.responses)
    rows = np.arange(48)
    prompts = [profile.prompts[i] for i in rows]
    answers = [profile.responses[model][i] for i in rows]
    static = load_static() if embedder == "static" else None
    if static is not None:
        pe, re_ = static.embed(prompts), static.embed([response_tail(a) for a in answers])
    else:
        pe, re_ = Embedder(tmp_path).embed(prompts), Embedder(tmp_path, **RESPONSE_EMBED).embed(answers)
    labels = {model: profile.column(model)[rows]}
    v = train_verifier(prompts, pe, {model: answers}, {model: re_}, labels, np.arange(40), seed=0, static=static)
    offline = v.score_embeddings(pe, re_, prompts, answers)
    path = v.save(tmp_path / "verifier.npz")
    files = [f.name for f in verifier_files(path)]
    assert files[:2] == ["verifier.npz", "verifier.npz.json"] and len(files) == (4 if static else 2)
    loaded = load_verifier(path, tmp_path)
    assert (loaded.static is None) == (static is None) and loaded.metadata["embedder"]["kind"] == embedder
    judge = VerifierJudge(loaded)

    async def one_by_one() -> list[float]:
        return [await judge.ajudge(p, a) for p, a in zip(prompts[40:], answers[40:], strict=True)]

    served = asyncio.run(one_by_one())
    np.testing.assert_allclose(served, offline[40:], atol=1e-6)
    assert judge.failures == 0


def test_a_damaged_verifier_file_is_refused_in_one_line(tmp_path: Path) -> None:
    from boute.errors import SpecError
    from boute.quality.static_embed import load_static

    static = load_static()
    prompts, answers = ["what is 2+2?", "name a colour"] * 4, ["4", "#### 5", "blue", "I cannot"] * 2
    pe, re_ = static.embed(prompts), static.embed(answers)
    v = train_verifier(
        prompts, pe, {"m": answers}, {"m": re_}, {"m": np.array([1, 0] * 4)}, np.arange(8), static=static
    )
    path = v.save(tmp_path / "v.npz")
    table = next(f for f in verifier_files(path) if f.suffix == ".npy")
    table.write_bytes(table.read_bytes()[:-8])
    with pytest.raises(SpecError) as e:
        load_verifier(path)
    assert "sha256" in str(e.value) or "hash" in str(e.value)
