"""Load sweep against a live OpenAI-compatible endpoint (SGLang, llama.cpp, vLLM, the BOute gateway).

Why streaming: TTFT and TPOT are only visible token by token. Each request streams; the client stamps the
first content chunk (TTFT) and the last one, and TPOT is (last - first) / (tokens - 1). Token counts come
from the server's ``usage`` when it sends one, else from counting content chunks (one token per chunk on
SGLang and llama.cpp).

Prompt lengths: the endpoint's tokenizer is unknown here, so prompts are random common English words and a
first non-streamed probe reads ``usage.prompt_tokens`` to learn tokens per word; later prompts use that
ratio. The mean measured prompt length is recorded with each point, not the requested one.

Load: ``concurrency`` closed-loop workers (each sends its next request when the previous one ends), or an
open-loop Poisson stream at ``rate_rps``.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from boute.errors import BouteError

__all__ = ["LoadPoint", "PointResult", "PromptMaker", "RequestResult", "measure_point", "run_sweep"]

Api = Literal["chat", "completions"]

_WORDS = [
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
]


@dataclass(frozen=True)
class LoadPoint:
    """One load level: closed-loop ``concurrency`` (or open-loop ``rate_rps``) x request shape."""

    concurrency: int = 1
    input_len: int = 128
    output_len: int = 64
    requests: int = 8
    rate_rps: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.input_len < 1 or self.output_len < 1 or self.requests < 1:
            raise BouteError(f"load point needs positive concurrency, lengths and requests, got {self}")
        if self.rate_rps is not None and self.rate_rps <= 0:
            raise BouteError(f"rate_rps must be > 0, got {self.rate_rps}")


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    ttft_s: float = float("nan")
    tpot_s: float = float("nan")
    e2e_s: float = float("nan")
    output_tokens: int = 0
    prompt_tokens: int | None = None
    error: str = ""


@dataclass(frozen=True)
class PointResult:
    """Aggregates of one load point (means over successful requests; times in ms)."""

    point: LoadPoint
    completed: int
    failed: int
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_p95: float
    tpot_ms_mean: float
    tpot_ms_p50: float
    e2e_ms_mean: float
    throughput_rps: float
    output_tokens_per_s: float
    mean_input_tokens: float
    mean_output_tokens: float
    wall_s: float
    errors: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["errors"] = list(self.errors)
        return d


class PromptMaker:
    """Random word prompts sized in the endpoint's own tokens (ratio learnt from one probe)."""

    def __init__(self, seed: int = 0, tokens_per_word: float = 1.0, overhead_tokens: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.tokens_per_word = tokens_per_word
        self.overhead_tokens = overhead_tokens

    def words(self, n: int) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(max(1, n)))

    def prompt(self, input_tokens: int) -> str:
        n = round((input_tokens - self.overhead_tokens) / self.tokens_per_word)
        return self.words(max(1, n))


def _body(api: Api, model: str, prompt: str, max_tokens: int, stream: bool, extra: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return {**body, **extra}


def _path(api: Api) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def _chunk_text(api: Api, chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if api == "chat":
        return (c.get("delta") or {}).get("content") or ""
    return c.get("text") or ""


async def _probe(client: Any, endpoint: str, api: Api, model: str, text: str, extra: dict[str, Any]) -> int:
    r = await client.post(endpoint + _path(api), json=_body(api, model, text, 1, False, extra))
    if r.status_code >= 400:
        raise BouteError(f"{endpoint}: probe request failed with HTTP {r.status_code}: {r.text[:200]}")
    usage = r.json().get("usage") or {}
    if "prompt_tokens" not in usage:
        raise BouteError(f"{endpoint}: the response has no usage.prompt_tokens; cannot size prompts")
    return int(usage["prompt_tokens"])


async def calibrate_prompts(
    client: Any, endpoint: str, api: Api, model: str, seed: int = 0, extra: dict[str, Any] | None = None
) -> PromptMaker:
    """Two probes (32 and 256 words) give tokens per word and the fixed template overhead."""
    maker = PromptMaker(seed)
    a = await _probe(client, endpoint, api, model, maker.words(32), extra or {})
    b = await _probe(client, endpoint, api, model, maker.words(256), extra or {})
    per_word = max(0.25, (b - a) / 224.0)
    maker.tokens_per_word = per_word
    maker.overhead_tokens = max(0.0, a - 32 * per_word)
    return maker


async def _one(
    client: Any, endpoint: str, api: Api, model: str, prompt: str, max_tokens: int, extra: dict[str, Any]
) -> RequestResult:
    body = _body(api, model, prompt, max_tokens, True, extra)
    t0 = time.perf_counter()
    first = last = None
    chunks = 0
    usage: dict[str, Any] = {}
    try:
        async with client.stream("POST", endpoint + _path(api), json=body) as resp:
            if resp.status_code >= 400:
                text = (await resp.aread()).decode("utf-8", "replace")[:200]
                return RequestResult(ok=False, error=f"HTTP {resp.status_code}: {text}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if _chunk_text(api, chunk):
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    chunks += 1
    except Exception as exc:  # network errors are results of the load test, not crashes of it
        return RequestResult(ok=False, error=f"{type(exc).__name__}: {exc}"[:200])
    end = time.perf_counter()
    if first is None or last is None:
        return RequestResult(ok=False, error="no content streamed")
    n = int(usage.get("completion_tokens") or chunks)
    tpot = (last - first) / (n - 1) if n > 1 else float("nan")
    prompt_tokens = usage.get("prompt_tokens")
    return RequestResult(
        ok=True,
        ttft_s=first - t0,
        tpot_s=tpot,
        e2e_s=end - t0,
        output_tokens=n,
        prompt_tokens=int(prompt_tokens) if prompt_tokens is not None else None,
    )


def _aggregate(point: LoadPoint, results: Sequence[RequestResult], wall: float, maker: PromptMaker) -> PointResult:
    ok = [r for r in results if r.ok]
    errors = tuple(sorted({r.error for r in results if not r.ok}))[:5]
    if not ok:
        nan = float("nan")
        return PointResult(point, 0, len(results), nan, nan, nan, nan, nan, nan, 0.0, 0.0, nan, nan, wall, errors)
    ttft = np.array([r.ttft_s for r in ok]) * 1e3
    tpot = np.array([r.tpot_s for r in ok]) * 1e3
    tpot = tpot[np.isfinite(tpot)]
    outs = np.array([r.output_tokens for r in ok], dtype=float)
    known = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    mean_in = float(np.mean(known)) if known else float(point.input_len)
    return PointResult(
        point=point,
        completed=len(ok),
        failed=len(results) - len(ok),
        ttft_ms_mean=float(ttft.mean()),
        ttft_ms_p50=float(np.median(ttft)),
        ttft_ms_p95=float(np.percentile(ttft, 95)),
        tpot_ms_mean=float(tpot.mean()) if tpot.size else float("nan"),
        tpot_ms_p50=float(np.median(tpot)) if tpot.size else float("nan"),
        e2e_ms_mean=float(np.mean([r.e2e_s for r in ok]) * 1e3),
        throughput_rps=len(ok) / wall,
        output_tokens_per_s=float(outs.sum()) / wall,
        mean_input_tokens=mean_in,
        mean_output_tokens=float(outs.mean()),
        wall_s=wall,
        errors=errors,
    )


async def measure_point(
    client: Any,
    endpoint: str,
    model: str,
    point: LoadPoint,
    maker: PromptMaker,
    *,
    api: Api = "chat",
    extra: dict[str, Any] | None = None,
    seed: int = 0,
) -> PointResult:
    """Run one load point to completion and aggregate it."""
    extra = extra or {}
    prompts = [maker.prompt(point.input_len) for _ in range(point.requests)]
    results: list[RequestResult] = []
    t0 = time.perf_counter()
    if point.rate_rps is None:
        queue = list(prompts)

        async def worker() -> None:
            while queue:
                p = queue.pop()
                results.append(await _one(client, endpoint, api, model, p, point.output_len, extra))

        await asyncio.gather(*(worker() for _ in range(min(point.concurrency, point.requests))))
    else:
        gaps = np.random.default_rng(seed).exponential(1.0 / point.rate_rps, size=point.requests)
        tasks = []
        for p, gap in zip(prompts, gaps, strict=True):
            await asyncio.sleep(float(gap))
            tasks.append(asyncio.create_task(_one(client, endpoint, api, model, p, point.output_len, extra)))
        results = list(await asyncio.gather(*tasks))
    return _aggregate(point, results, time.perf_counter() - t0, maker)


async def _sweep(
    endpoint: str,
    model: str,
    points: Sequence[LoadPoint],
    api: Api,
    timeout_s: float,
    warmup: int,
    extra: dict[str, Any],
    seed: int,
    api_key: str | None,
) -> list[PointResult]:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max(p.concurrency for p in points) + 64)
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers, limits=limits, trust_env=False) as client:
        try:
            maker = await calibrate_prompts(client, endpoint, api, model, seed, extra)
        except httpx.HTTPError as exc:
            raise BouteError(f"{endpoint}: cannot reach the endpoint ({type(exc).__name__}: {exc})") from None
        for _ in range(warmup):
            await _one(client, endpoint, api, model, maker.prompt(points[0].input_len), 4, extra)
        return [await measure_point(client, endpoint, model, p, maker, api=api, extra=extra, seed=seed) for p in points]


def run_sweep(
    endpoint: str,
    model: str,
    points: Sequence[LoadPoint],
    *,
    api: Api = "chat",
    timeout_s: float = 300.0,
    warmup: int = 1,
    extra: dict[str, Any] | None = None,
    seed: int = 0,
    api_key: str | None = None,
) -> list[PointResult]:
    """Measure every load point in turn (after ``warmup`` short requests); blocking wrapper."""
    if not points:
        raise BouteError("no load points to measure")
    endpoint = endpoint.rstrip("/").removesuffix("/v1")
    return asyncio.run(_sweep(endpoint, model, points, api, timeout_s, warmup, extra or {}, seed, api_key))
