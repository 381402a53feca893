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
    try:
        first = await judge.ajudge("q", "x" * 10)
        answers = ["y" * n for n in range(1, 9)] + ["bad"]
        scores = await asyncio.gather(*(judge.ajudge("q", a) for a in answers))
    finally:
        judge.close()
    assert first == pytest.approx(0.10)
    assert scores[:-1] == pytest.approx([n / 100 for n in range(1, 9)]) and scores[-1] == 0.0
    # one call for the first answer, one for the nine that queued together (failed), then one per answer
    assert fake.calls[:2] == [1, 9] and len(fake.calls) == 2 + 9
    assert judge.failures == 1 and judge.last_error is not None and "cannot embed" in judge.last_error


def test_the_gateway_scores_an_answer_as_the_optimiser_did(tmp_path: Path) -> None:
    """A verifier trained on real GSM8K answers, saved as a plan bundles it and loaded as the gateway does:
    one answer at a time through the judge gives the offline (batched, cached) score to 1e-6."""
    from boute.quality import load_profile
    from boute.quality.embed import Embedder
    from boute.quality.judges import RESPONSE_EMBED

    profile = load_profile("builtin:gsm8k")
    model = next(m for m in profile.models if m in profile.responses)
    rows = np.arange(48)
    prompts = [profile.prompts[i] for i in rows]
    answers = [profile.responses[model][i] for i in rows]
    pe = Embedder(tmp_path).embed(prompts)
    re_ = Embedder(tmp_path, **RESPONSE_EMBED).embed(answers)
    labels = {model: profile.column(model)[rows]}
    v = train_verifier(prompts, pe, {model: answers}, {model: re_}, labels, np.arange(40), seed=0)
    offline = v.score_embeddings(pe, re_, prompts, answers)
    path = v.save(tmp_path / "verifier.npz")
    assert [f.name for f in verifier_files(path)] == ["verifier.npz", "verifier.npz.json"]
    judge = VerifierJudge(load_verifier(path, tmp_path))

    async def one_by_one() -> list[float]:
        return [await judge.ajudge(p, a) for p, a in zip(prompts[40:], answers[40:], strict=True)]

    try:
        served = asyncio.run(one_by_one())
    finally:
        judge.close()
    np.testing.assert_allclose(served, offline[40:], atol=1e-6)
    assert judge.failures == 0
