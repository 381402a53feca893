"""What prefix affinity costs the gateway per request (issue 51 item 3: microseconds).

Microbenchmarks (``timeit``, the minimum of 7 repeats, per call), on a tier of 8 replicas whose index already
holds 2,000 prompts (50 system prompts of ~1,600 characters, each with its own questions):

- ``keys``: the prompt as sent rendered (:func:`router.openai_io.affinity_text`) and hashed into block keys
  (:func:`boute.sim.affinity.prompt_keys`), for chats of ~500, ~2,000 and ~20,000 characters (the last bounded
  by ``max_blocks``);
- ``pick``: :meth:`router.balancer.Balancer.pick` with those keys (match, choice, record) against the
  least-load pick without keys;
- ``total``: keys + pick, the work affinity adds to a request over least load.

``python -m bench affinity [--quick]`` writes ``bench/results/affinity.json``.
"""

from __future__ import annotations

import random
import timeit
from typing import Any

from boute.serving import BackendSpec
from boute.sim.affinity import prompt_keys
from boute.specs.plan import Plan
from router.balancer import Balancer
from router.config import Settings
from router.openai_io import CHAT, affinity_text

PLAN: dict[str, Any] = {
    "scenario": "builtin:paper-gsm8k",
    "routing": {"tiers": ["small"], "fractions": [1.0]},
    "deployment": [{"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 8}],
    "affinity": {},
}


def _chat(system: str, question: str) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}


def _us(fn: Any, number: int) -> float:
    """Microseconds per call: the minimum over 7 repeats of ``number`` calls."""
    return round(min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6, 2)


def run(quick: bool = False) -> dict[str, Any]:
    rng = random.Random(0)
    bal = Balancer(Settings())
    specs = [BackendSpec(url=f"http://r{i}:1", tier="small", model="llama-3.1-8b") for i in range(8)]
    bal.configure(Plan.model_validate(PLAN), specs)
    settings = bal.affinity
    assert settings is not None
    limit = settings.block_chars * settings.max_blocks
    systems = [f"System prompt {i}: " + "follow the house style and cite sources. " * 40 for i in range(50)]
    for n in range(2000):  # a warm index: every system prompt seen, with its own questions
        body = _chat(rng.choice(systems), f"question {n}? " * 5)
        r = bal.pick("small", (), prompt_keys(affinity_text(body, CHAT, limit), settings))
        assert r is not None
    for i, r in enumerate(bal.pools["small"]):
        r.outstanding = i % 3
    number = 2000 if quick else 20000
    out: dict[str, Any] = {
        "replicas": 8,
        "index_blocks_held": len(bal.indexes["small"]),
        "settings": settings.model_dump(),
    }
    out["least_load_pick_us"] = _us(lambda: bal.pick("small"), number)
    for label, body in (
        ("chat_500_chars", _chat(systems[0][:400], "what is the capital of France? " * 3)),
        ("chat_2000_chars", _chat(systems[1], "what is the capital of France? " * 13)),
        ("chat_20000_chars", _chat(systems[2] * 12, "and the question? " * 10)),
    ):
        keys = prompt_keys(affinity_text(body, CHAT, limit), settings)
        k_us = _us(lambda body=body: prompt_keys(affinity_text(body, CHAT, limit), settings), number)
        p_us = _us(lambda keys=keys: bal.pick("small", (), keys), number)
        out[label] = {
            "blocks": len(keys.keys),
            "keys_us": k_us,
            "pick_us": p_us,
            "total_us": round(k_us + p_us, 2),
            "added_over_least_load_us": round(k_us + p_us - out["least_load_pick_us"], 2),
        }
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick=True), indent=2))
