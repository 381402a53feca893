"""Real SGLang's prefix cache against BOute's model of it (issue 51): reported vs predicted cached tokens, and TTFT.

One real SGLang 0.5.23 CPU replica (``make sglang``: SmolLM2-135M bf16) replays a small conversation set: 4 system
prompts (~300-800 tokens) x 6 conversations x 2 turns. Turn 2 is turn 1's messages, the answer SGLang actually
returned, and a new question. Per request the bench records what SGLang reported (``prompt_tokens``,
``prompt_tokens_details.cached_tokens``: the replica runs with ``--enable-cache-report`` as BOute launches it)
and the streamed TTFT (first content chunk).

Beside it, :class:`boute.perf.prefix_cache.PrefixCache` is fed the same requests in the same order, as exact
token paths: the prompt ids SGLang prefilled and the answer ids it sampled (its ``sglext`` ids, the keys of its
radix tree), cut into blocks of SGLang's ``page_size``, with capacity = its reported ``max_total_num_tokens``.
Per request the model matches the prompt, is held to the pool less what the request needs (its uncached prompt
and ``max_tokens`` of answer, as SGLang's lazy eviction leaves room), then inserts prompt + answer less the last
answer token (the sampled token whose KV is never computed). The pool is 3,072 tokens, below the ~4,000 the set
touches (the system prompts alone ~2,300), so LRU eviction is exercised as well as matching.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

#: (topic, target tokens) of the four system prompts
SYSTEMS = (("billing", 300), ("shipping", 450), ("returns", 600), ("warranty", 800))
CONVERSATIONS = 6
#: the KV pool: small enough that the set does not fit, so the model's eviction is compared too
POOL_TOKENS = 3072


def _system_prompt(topic: str, tokens: int) -> str:
    """A support-desk system prompt of roughly ``tokens`` SmolLM2 tokens (a rule is ~28 with the template)."""
    rules = [
        f"Rule {i}: when a customer asks about {topic} case {i}, answer in one sentence and cite section {i * 7 % 97}."
        for i in range(max(1, tokens // 28))
    ]
    return f"You are the {topic} desk of an online shop. Follow these rules.\n" + "\n".join(rules)


def _question(topic: str, conv: int, turn: int) -> str:
    if turn == 1:
        return f"Customer {conv}: what does rule {conv * 3 + 1} say about my {topic} problem?"
    return f"Customer {conv}: thanks. And what should I do if that does not work for my order {100 + conv}?"


def _path(ids: list[int], page: int) -> list[tuple[Any, int]]:
    from boute.perf.prefix_cache import token_path

    return token_path([str(t) for t in ids], block_tokens=page)


def _replay(url: str, page: int, pool: int, conversations: int, max_tokens: int) -> tuple[list[dict[str, Any]], int]:
    """Every request of the set on the replica, in order (turn 1 of all, then turn 2), with the model's prediction;
    and the tokens the model evicted."""
    from backends.sglang.cpu import stream_chat
    from boute.perf.prefix_cache import PrefixCache

    cache = PrefixCache(pool)

    def send(messages: list[dict[str, str]]) -> tuple[Any, int]:
        got = stream_chat(url, {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
        predicted = cache.match(_path(got.input_ids, page), len(got.input_ids))
        cache.limit(pool - (len(got.input_ids) - predicted) - max_tokens)
        cache.limit(pool)
        cache.insert(_path(got.input_ids + got.output_ids[:-1], page))
        return got, predicted

    send([{"role": "user", "content": "Warm-up: say hello."}])  # first-shape costs, not recorded
    rows: list[dict[str, Any]] = []
    history: dict[tuple[int, int], list[dict[str, str]]] = {}
    for turn in (1, 2):
        for conv in range(conversations):
            for s, (topic, tokens) in enumerate(SYSTEMS):
                base = history.get((s, conv)) or [{"role": "system", "content": _system_prompt(topic, tokens)}]
                messages = [*base, {"role": "user", "content": _question(topic, conv, turn)}]
                got, predicted = send(messages)
                history[(s, conv)] = [*messages, {"role": "assistant", "content": got.text}]
                assert got.usage["prompt_tokens"] == len(got.input_ids), (got.usage, len(got.input_ids))
                rows.append(
                    {
                        "system": s,
                        "conversation": conv,
                        "turn": turn,
                        "prompt_tokens": got.usage["prompt_tokens"],
                        "answer_tokens": got.usage["completion_tokens"],
                        "cached_reported": got.cached_tokens,
                        "cached_predicted": predicted,
                        "ttft_ms": round(got.ttft_s * 1e3, 1),
                    }
                )
    return rows, cache.evicted_tokens


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals (cached share reported vs predicted), per-request agreement, and TTFT of hits vs misses."""
    prompt = sum(r["prompt_tokens"] for r in rows)
    reported = sum(r["cached_reported"] for r in rows)
    predicted = sum(r["cached_predicted"] for r in rows)
    diffs = [r["cached_predicted"] - r["cached_reported"] for r in rows]
    # a hit: SGLang reported at least half the prompt cached; a miss: under a tenth (the chat template's header)
    hits = [r["ttft_ms"] for r in rows if r["cached_reported"] >= r["prompt_tokens"] / 2]
    misses = [r["ttft_ms"] for r in rows if r["cached_reported"] < r["prompt_tokens"] / 10]

    def stats(xs: list[float]) -> dict[str, Any]:
        return {"n": len(xs), "median_ms": round(statistics.median(xs), 1) if xs else None, "all_ms": xs}

    return {
        "requests": len(rows),
        "prompt_tokens": prompt,
        "cached_reported": reported,
        "cached_predicted": predicted,
        "cached_share_reported": round(reported / prompt, 4),
        "cached_share_predicted": round(predicted / prompt, 4),
        "requests_predicted_exactly": sum(d == 0 for d in diffs),
        "abs_error_tokens_total": sum(abs(d) for d in diffs),
        "max_abs_error_tokens": max(abs(d) for d in diffs),
        "ttft_hits": stats(hits),
        "ttft_misses": stats(misses),
    }


def run(quick: bool = False) -> dict[str, Any]:
    from backends.sglang.cpu import start_cpu_replica
    from tests.services import free_port

    conversations, max_tokens = (2, 12) if quick else (CONVERSATIONS, 16)
    with tempfile.TemporaryDirectory() as tmp:
        replica = start_cpu_replica(free_port(), Path(tmp) / "server.log", max_total_tokens=POOL_TOKENS)
        try:
            info = httpx.get(replica.url + "/get_server_info", timeout=30).json()
            page, pool = int(info["page_size"]), int(info["max_total_num_tokens"])
            rows, evicted = _replay(replica.url, page, pool, conversations, max_tokens)
        finally:
            replica.stop()
    return {
        "setup": {
            "engine": f"sglang {info.get('version')} CPU, SmolLM2-135M bf16, torch_native attention",
            "flags": "--enable-cache-report, --max-total-tokens " + str(POOL_TOKENS),
            "page_size": page,
            "max_total_num_tokens": pool,
            "systems": [{"topic": t, "target_tokens": n} for t, n in SYSTEMS],
            "conversations_per_system": conversations,
            "turns": 2,
            "max_tokens": max_tokens,
            "startup_to_health_s": round(replica.ready_s, 1),
            "model": "boute.perf.prefix_cache.PrefixCache over SGLang's own prompt and answer ids (sglext)",
        },
        "summary": {**_summary(rows), "model_evicted_tokens": evicted},
        "per_request": rows,
    }
