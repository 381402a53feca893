"""Judges for the cascade mode: after a tier answers, a judge decides whether to accept or escalate.

- :class:`LLMJudge` asks any OpenAI-compatible endpoint (vLLM, SGLang, OpenAI, the emulated backend) to
  rate the answer 1-10, production style. Anything that goes wrong (timeout, HTTP error, a reply with no
  rating) returns 0.0, which a cascade reads as "escalate": a broken judge costs money, never quality.
- :class:`OfflineVerifier` is what the optimiser scores cascades with, and what the gateway then runs
  (:class:`VerifierJudge`, its files in the plan's bundle) so the thresholds mean the same on both sides: a
  logistic regression on embeddings of (prompt, response) and their product, trained on the profile's
  recorded ``<model>_response`` texts to predict "this answer is good" (normalised score >= 0.5). Responses
  are embedded from their *end*, where the final answer is. Eight response-shape features (length, lines,
  numbers, calculator marks, a final-answer marker, hedging words, rounding, repeated numbers) and the
  router's prompt-shape features are appended. Embeddings: the router's static token vectors by default
  (~0.3 ms of one core per answer, so the gateway judges at proxy speed), or MiniLM (~60 ms; no better on
  held-out AUC): ``bench/bench_judge.py`` measures both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from boute.errors import SpecError
from boute.quality.embed import EmbedOptions
from boute.quality.head import LinearHead, fit_head, shape_features
from boute.quality.static_embed import StaticEmbedder, static_from_metadata

VERIFIER_FORMAT = "boute-verifier/1"
#: how responses are embedded for the verifier: their end, where the final answer is
RESPONSE_EMBED = EmbedOptions(max_tokens=128, truncate="left")
#: the static verifier's view of a response: its last characters (~130 tokens, as MiniLM's 128-token end)
RESPONSE_TAIL_CHARS = 600
#: what a verifier embeds (prompt, response) with: ``static`` (default) the router's distilled token
#: vectors, ~0.1 ms a pair, so the gateway judges at proxy speed; ``minilm`` the model itself, ms a pair
VERIFIER_EMBEDDERS = ("static", "minilm")
DEFAULT_VERIFIER_EMBEDDER = "static"


class JudgeFailed(float):
    """The 0.0 a judge gives an answer it could not score (an error, a timeout, a reply with no rating): it
    escalates like any 0.0, and its type tells it from a real 0.0 (the gateway's route reason says
    ``judge-failed``: boute.serving.reason). Use ``float(x)`` before ``orjson`` (which refuses subclasses)."""


#: the score of an answer the judge could not score
JUDGE_FAILED = JudgeFailed(0.0)


def response_tail(text: str) -> str:
    """The part of an answer the static verifier embeds (its end: where the final answer is)."""
    return text[-RESPONSE_TAIL_CHARS:]


JUDGE_TEMPLATE = (
    "Please act as an impartial judge and evaluate the quality of the response provided by an AI assistant "
    "to the user question below. Consider correctness first, then helpfulness. Be as objective as possible. "
    'After a short explanation, rate the response on a scale of 1 to 10 in exactly this format: "[[rating]]", '
    'for example "Rating: [[5]]".\n\n[Question]\n{prompt}\n\n[The Start of Assistant\'s Answer]\n{response}\n'
    "[The End of Assistant's Answer]"
)

_PATTERNS = (
    re.compile(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]"),
    re.compile(r"rating\s*[:=]?\s*\**\s*(\d+(?:\.\d+)?)", re.I),
    re.compile(r"(\d+(?:\.\d+)?)\s*(?:/|out of)\s*10\b", re.I),
    re.compile(r"^\s*(\d+(?:\.\d+)?)\s*\.?\s*$"),
)


def parse_rating(text: str) -> float | None:
    """The 1-10 rating in a judge's reply, or None. The *last* ``[[x]]`` wins (judges restate the scale)."""
    for pat in _PATTERNS:
        found = pat.findall(text or "")
        if found:
            value = float(found[-1])
            if 1.0 <= value <= 10.0:
                return value
    return None


@dataclass
class LLMJudge:
    """Async LLM-as-judge over ``POST {base_url}/chat/completions``; ``ajudge`` returns a score in [0, 1]."""

    base_url: str
    model: str
    #: seconds a call may take before it scores 0.0; no default here: the gateway's and the profiler's is
    #: :data:`boute.serving.timeouts.JUDGE_TIMEOUT_S` (a layer above quality), and every caller passes one
    timeout: float
    api_key: str | None = None
    template: str = JUDGE_TEMPLATE
    max_tokens: int = 256
    last_error: str | None = field(default=None, init=False)
    failures: int = field(default=0, init=False)  # replies that were escalated for want of a rating

    def _request(self, prompt: str, response: str) -> dict[str, Any]:
        content = self.template.format(prompt=prompt, response=response)
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
        }

    async def ajudge(self, prompt: str, response: str, client: Any = None) -> float:
        """(rating - 1) / 9, or :data:`JUDGE_FAILED` (0.0: escalate) on timeout, HTTP error or an unparseable reply."""
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = self.base_url.rstrip("/") + "/chat/completions"
        try:
            if client is None:
                async with httpx.AsyncClient(timeout=self.timeout) as c:
                    r = await c.post(url, json=self._request(prompt, response), headers=headers)
            else:
                r = await client.post(url, json=self._request(prompt, response), headers=headers, timeout=self.timeout)
            r.raise_for_status()
            text = r.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.failures += 1
            return JUDGE_FAILED
        rating = parse_rating(text if isinstance(text, str) else "")
        if rating is None:
            self.last_error = f"no rating in reply: {str(text)[:80]!r}"
            self.failures += 1
            return JUDGE_FAILED
        self.last_error = None
        return (rating - 1.0) / 9.0

    async def ajudge_many(self, pairs: Sequence[tuple[str, str]], concurrency: int = 8) -> np.ndarray:
        """Judge many (prompt, response) pairs over one connection pool, ``concurrency`` at a time."""
        import asyncio

        import httpx

        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=self.timeout) as client:

            async def one(p: str, r: str) -> float:
                async with sem:
                    return await self.ajudge(p, r, client)

            return np.array(await asyncio.gather(*(one(p, r) for p, r in pairs)), dtype=np.float64)


_NUMS = re.compile(r"-?\d+(?:\.\d+)?")
_HEDGE = re.compile(r"\b(sorry|however|assum|unclear|cannot)", re.I)
_ROUND = re.compile(r"\b(approximately|round|about)\b", re.I)


def response_features(responses: Sequence[str]) -> np.ndarray:
    """Eight shape features of an answer: how it is built often tells whether it went wrong."""
    rows = []
    for t in responses:
        nums = _NUMS.findall(t)
        rows.append(
            [
                math.log1p(len(t)),
                t.count("\n"),
                len(nums),
                t.count("<<"),
                1.0 if "####" in t else 0.0,
                1.0 if _HEDGE.search(t) else 0.0,
                1.0 if _ROUND.search(t) else 0.0,
                len(set(nums)) / (1 + len(nums)),
            ]
        )
    return np.asarray(rows, dtype=np.float64).reshape(len(responses), 8)


def _shape(prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
    return np.hstack([response_features(responses), shape_features(prompts)])


@dataclass
class OfflineVerifier:
    """P(answer is good | prompt, response) from embeddings of both; ``score`` is in [0, 1].

    ``static`` set: embeddings are the static (model2vec-distilled MiniLM) table's, the response's by its
    last :data:`RESPONSE_TAIL_CHARS` characters; unset: MiniLM's (:data:`RESPONSE_EMBED` for responses)."""

    head: LinearHead
    feat_mean: np.ndarray
    feat_std: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)
    cache_dir: Path | None = None
    static: StaticEmbedder | None = None

    def features(
        self, prompt_emb: np.ndarray, response_emb: np.ndarray, prompts: Sequence[str], responses: Sequence[str]
    ) -> np.ndarray:
        # The product term lets a linear model ask "does this answer fit this question".
        shape = (_shape(prompts, responses) - self.feat_mean) / self.feat_std
        return np.hstack([prompt_emb, response_emb, prompt_emb * response_emb, shape]).astype(np.float64)

    def score_embeddings(
        self, prompt_emb: np.ndarray, response_emb: np.ndarray, prompts: Sequence[str], responses: Sequence[str]
    ) -> np.ndarray:
        return self.head.proba(self.features(prompt_emb, response_emb, prompts, responses))[:, 1]

    def embed(
        self, prompts: Sequence[str], responses: Sequence[str], *, cache: bool | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(prompt embeddings, response embeddings) as this verifier sees them.

        MiniLM embeddings go through the disk cache's float16 rounding whether or not they are cached
        (``cache``; by default 32 texts or more are), so answers scored at serving time get the score the
        optimiser computed for the same texts, not one a rounding away from a threshold. Static embeddings
        are the same for a text alone or in a batch (and need no cache: microseconds a text)."""
        if self.static is not None:
            return self.static.embed(prompts), self.static.embed([response_tail(r) for r in responses])
        from boute.quality.embed import Embedder

        cache = len(prompts) >= 32 if cache is None else cache
        ep = Embedder(self.cache_dir).embed(prompts, cache=cache)
        er = Embedder(self.cache_dir, **RESPONSE_EMBED).embed(responses, cache=cache)
        return ep, er

    def score(self, prompts: Sequence[str], responses: Sequence[str], *, cache: bool | None = None) -> np.ndarray:
        """P(good) per (prompt, response) (``cache``: see :meth:`embed`)."""
        ep, er = self.embed(prompts, responses, cache=cache)
        return self.score_embeddings(ep, er, prompts, responses)

    def save(self, path: str | Path) -> Path:
        """Weights, metadata and (static) the table and tokenizer, as a router is saved (hashes in metadata)."""
        from boute.quality.router import Router

        router = Router(self.head, self.feat_mean, self.feat_std, self.metadata, static=self.static)
        out = router.save(path)
        self.metadata = router.metadata  # now with the files and their hashes
        return out


class VerifierJudge:
    """An :class:`OfflineVerifier` as a cascade judge on the gateway's path: ``ajudge`` in [0, 1].

    Scoring never runs on the event loop: one worker thread scores, and the answers that arrive while it is
    busy wait for its next call and are scored together in one batch (the cost per answer falls with the
    batch, so under load the judge keeps up instead of queueing one answer behind another). A static
    verifier takes ~0.3 ms of CPU an answer, a MiniLM one tens of ms, which is what the thread is for.
    Scores are those of :meth:`OfflineVerifier.score` for the same texts. An answer the verifier cannot score (any error) gets 0.0, which escalates: a broken judge costs
    money, never quality, as with :class:`LLMJudge`; ``failures`` counts them and ``last_error`` says why.
    """

    def __init__(self, verifier: OfflineVerifier, max_batch: int = 32) -> None:
        self.verifier = verifier
        self.max_batch = max_batch
        self.failures = 0
        self.last_error: str | None = None
        self._pending: list[tuple[str, str, Any]] = []  # (prompt, response, future), event-loop side only
        self._busy = False

    def warm(self) -> None:
        """Load the embedding model now, so the first cascade request does not pay for it."""
        self.verifier.score(["warm-up"], ["warm-up"], cache=False)

    def score_many(self, prompts: list[str], responses: list[str]) -> list[float]:
        """Scores of a batch (on the worker thread). A batch that fails is scored one by one, so one bad answer
        fails alone; a failed or non-finite score is 0.0 and counted."""
        try:
            # cache=False: serving writes no embedding files
            vals = [float(v) for v in self.verifier.score(prompts, responses, cache=False)]
        except Exception as exc:
            if len(prompts) == 1:
                return [self._failed(exc)]
            return [self.score_many([p], [r])[0] for p, r in zip(prompts, responses, strict=True)]
        return [v if math.isfinite(v) else self._failed(ValueError(f"non-finite score {v}")) for v in vals]

    async def ajudge(self, prompt: str, response: str) -> float:
        import asyncio

        fut = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, response, fut))
        if not self._busy:
            self._busy = True
            asyncio.ensure_future(self._drain())
        return await fut

    async def _drain(self) -> None:
        """Score what is pending, batch after batch, until nothing is (runs on the event loop, scores off it)."""
        import asyncio

        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                prompts, responses = [b[0] for b in batch], [b[1] for b in batch]
                try:
                    scores = await loop.run_in_executor(_judge_thread(), self.score_many, prompts, responses)
                except Exception as exc:  # the executor itself failed: every answer of the batch escalates
                    scores = [self._failed(exc)] * len(batch)
                for (_, _, fut), v in zip(batch, scores, strict=True):
                    if not fut.done():
                        fut.set_result(v)
        finally:
            self._busy = False

    def _failed(self, exc: BaseException) -> float:
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        return JUDGE_FAILED


@lru_cache(maxsize=1)
def _judge_thread() -> ThreadPoolExecutor:
    """The process's one judging thread, shared by every :class:`VerifierJudge` (a gateway compiles a new
    judge with each plan it adopts; one thread each would pile up idle ones)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="boute-judge")


def train_verifier(
    prompts: Sequence[str],
    prompt_emb: np.ndarray,
    responses: Mapping[str, Sequence[str]],
    response_embs: dict[str, np.ndarray],
    labels: dict[str, np.ndarray],
    train: np.ndarray,
    *,
    seed: int = 0,
    good_threshold: float = 0.5,
    static: StaticEmbedder | None = None,
) -> OfflineVerifier:
    """Fit on the training rows of every model given (pooled: more examples of good and bad answers).

    ``prompt_emb`` / ``response_embs`` are the embeddings the verifier will compute itself
    (:meth:`OfflineVerifier.embed`): with ``static``, that embedder's."""
    tr_prompts = [prompts[i] for i in train]
    shapes = {m: _shape(tr_prompts, [responses[m][i] for i in train]) for m in response_embs}
    stacked = np.vstack(list(shapes.values()))
    mean, std = stacked.mean(axis=0), stacked.std(axis=0)
    v = OfflineVerifier(
        LinearHead(np.zeros((1, 1)), np.zeros(1), np.arange(2)), mean, np.where(std > 0, std, 1.0), static=static
    )
    x = np.vstack(
        [
            v.features(prompt_emb[train], response_embs[m][train], tr_prompts, [responses[m][i] for i in train])
            for m in response_embs
        ]
    )
    y = np.concatenate([(labels[m][train] >= good_threshold).astype(int) for m in response_embs])
    head, c = fit_head(x, y, seed)
    if static is not None:
        what = "static (model2vec-distilled MiniLM)"
        embedder: dict[str, Any] = {"kind": "static", **static.info, "max_tokens": static.max_tokens, "dim": static.dim}
        embedder["response_tail_chars"] = RESPONSE_TAIL_CHARS
    else:
        what, embedder = "MiniLM", {"kind": "minilm", "response": dict(RESPONSE_EMBED)}
    meta = {
        "format": VERIFIER_FORMAT,
        "kind": f"logistic regression on {what} (prompt, response, product) embeddings + 15 shape features",
        "models": list(response_embs),
        "good_threshold": good_threshold,
        "C": c,
        "n_train": int(len(y)),
        "embedder": embedder,
    }
    return OfflineVerifier(head, v.feat_mean, v.feat_std, meta, static=static)


def load_verifier(path: str | Path, cache_dir: Path | None = None) -> OfflineVerifier:
    """A verifier saved by :meth:`OfflineVerifier.save`; a static one's table and tokenizer hash-checked.
    Loading a static verifier imports numpy and ``tokenizers`` only (no torch)."""
    from boute.quality.head import meta_path, read_metadata, read_weights, verify_files

    p = Path(path)
    meta = read_metadata(p, VERIFIER_FORMAT)
    emb = meta.get("embedder", {"kind": "minilm"})  # verifiers saved before the static one are MiniLM
    kind = str(emb.get("kind", "minilm"))
    if kind not in VERIFIER_EMBEDDERS:
        raise SpecError(meta_path(p), "embedder.kind", f"must be one of {', '.join(VERIFIER_EMBEDDERS)}, got {kind!r}")
    static = None
    if kind == "static":
        static = static_from_metadata(verify_files(p, meta, ("weights", "table", "tokenizer")), emb)
    head, extra = read_weights(p)
    if "feat_mean" not in extra or "feat_std" not in extra:
        raise SpecError(p, "feat_mean", "missing from the weights file")
    n_features = 3 * (static.dim if static is not None else 384) + len(extra["feat_mean"])
    if head.coef.shape[1] != n_features:
        raise SpecError(p, "coef", f"expects {head.coef.shape[1]} features, this {kind} verifier computes {n_features}")
    return OfflineVerifier(head, extra["feat_mean"], extra["feat_std"], meta, cache_dir, static)


def verifier_files(path: str | Path) -> list[Path]:
    """The files of the verifier at ``path`` (weights, metadata, then a static one's table and tokenizer),
    loaded once to prove they open: what a cascade plan's bundle copies."""
    from boute.quality.head import meta_path

    v = load_verifier(path)
    p = Path(path)
    extra = [p.with_name(f["name"]) for role, f in v.metadata.get("files", {}).items() if role != "weights"]
    return [p, meta_path(p), *extra]
