"""What ``boute verify`` sends: the plan's own scenario workload replayed with the quality profile's held-out
prompts, as request bodies with their arrival times (:func:`build_requests`).

A request asks what the simulator counted: a multi-turn query sends its earlier turns, a prompt with a shared
prefix carries it (:func:`prefixed_messages`), and ``--max-tokens`` caps every answer. :mod:`boute.serving.verify`
judges what came back; :mod:`boute.optimize.replay` sends the same messages to measure a plan's quality.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from boute.errors import BouteError
from boute.quality.profiles import QualityProfile
from boute.specs.scenario import Scenario

if TYPE_CHECKING:
    from boute.workload import Workload


@dataclass(frozen=True)
class Requests:
    """What the load generator sends: arrival times (model seconds), bodies, and the profile row of each."""

    send_at: np.ndarray
    bodies: list[str]
    rows: np.ndarray
    max_tokens: int | None = None  # the cap ``--max-tokens`` put on every answer (None: the scenario's lengths)
    capped: int = 0  # requests whose answer length the cap set or lowered


def build_requests(
    scenario: Scenario,
    profile: QualityProfile,
    held_out: np.ndarray,
    *,
    duration_s: float | None = None,
    rate_rps: float | None = None,
    seed: int = 0,
    max_tokens: int | None = None,
    assign: Callable[[np.ndarray], np.ndarray] | None = None,
    stream_share: float = 0.0,
) -> Requests:
    """The stream the simulator judged the plan on (:func:`boute.workload.replay_workload`: the scenario's
    arrivals, each carrying a held-out profile prompt, drawn with replacement in the scenario's mix).

    Where the profile records the tiers' answers (GSM8K's CSV, MT-Bench's judgements), an emulated replica
    answers with them and the request asks for no length; where it does not, the request asks for the answer
    length the workload model gives that prompt, as the simulator assumed.

    ``max_tokens`` caps every answer (``boute verify --max-tokens``): a real engine at a few tokens/s cannot
    finish unbounded GSM8K answers within any useful timeout. Capped answers are shorter than the ones the plan
    was judged on, so :func:`compare` then reports P95 instead of judging it (``Requests.capped`` counts them).

    Where the workload's prompts share prefixes (``workload.prefixes``), each request carries them as the
    simulator counted them (:func:`prefixed_messages`); ``assign`` (profile rows -> the tier that answers
    each, the plan's routing as the simulator applied it) says whose answer a conversation's next turn
    repeats. ``stream_share``: that share of the requests (drawn with ``seed``) ask for a streamed answer, so the replay
    measures time to first token on them; a sample, because every streamed token is an event the gateway and
    the replicas spend CPU on, which on a small machine would slow the very latencies being measured."""
    from boute.workload import replay_workload
    from boute.workload.profiles import profile_lengths

    w = replay_workload(
        scenario, np.asarray(held_out, dtype=np.int64), duration_s=duration_s, rate_rps=rate_rps, seed=seed
    )
    rows = w.prompt_index
    if (rows < 0).any():  # lengths not from the profile (a trace's, synthetic): its prompts carry no row
        rows = np.random.default_rng(seed).choice(np.asarray(held_out, dtype=np.int64), size=len(rows))
    models = tuple(t.quality_model or t.name for t in scenario.tiers)
    answered = all(m in profile.responses for m in models)
    out_len = None
    if not answered:
        base = scenario.source.parent if scenario.source is not None else None
        out_len = profile_lengths(scenario.quality.profile, scenario.quality.format, models, base).output_tokens
    if max_tokens is not None and max_tokens < 1:
        raise BouteError(f"max_tokens must be >= 1, got {max_tokens}")
    chats = (
        prefixed_messages(scenario, profile, w, rows, tier_answers(scenario, profile, assign, rows))
        if w.prefixes is not None
        else [replay_messages(profile, int(r)) for r in rows]
    )
    streamed = np.random.default_rng([seed, 7]).random(len(rows)) < stream_share
    bodies = []
    capped = 0
    for r, messages, stream in zip(rows, chats, streamed, strict=True):
        body: dict[str, Any] = {"model": "boute", "messages": messages}
        if stream:  # the usage chunk carries the prompt and cached tokens
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        if out_len is not None:
            body["max_tokens"] = int(out_len[r])
        capped += cap_max_tokens(body, max_tokens)
        bodies.append(json.dumps(body))
    return Requests(w.arrival_s, bodies, rows, max_tokens, capped)


def tier_answers(
    scenario: Scenario, profile: QualityProfile, assign: Callable[[np.ndarray], np.ndarray] | None, rows: np.ndarray
) -> list[str] | None:
    """The answer each request's client gets: the recorded response, for its prompt, of the model of the tier
    ``assign`` sends it to (what an emulated replica of that tier answers). None when no request is a later
    turn of a conversation (nothing repeats an answer); BouteError when one is and the answers are unknown."""
    if scenario.workload.prefixes is None or scenario.workload.prefixes.conversations is None:
        return None
    from boute.quality.build import tier_models

    models = tier_models(scenario, profile)
    missing = [m for m in models if m not in profile.responses]
    if assign is None or missing:
        why = "no routing to tell whose answers" if assign is None else f"no recorded answers of {missing}"
        raise BouteError(f"workload.prefixes.conversations: a later turn repeats its client's answer, but {why}")
    tiers = assign(rows)
    return [profile.responses[models[int(t)]][int(r)] for t, r in zip(tiers, rows, strict=True)]


def prefixed_messages(
    scenario: Scenario,
    profile: QualityProfile,
    w: Workload,
    rows: np.ndarray,
    answers: list[str] | None,
) -> list[list[dict[str, str]]]:
    """The chat of each request of a workload whose prompts share prefixes (:mod:`boute.workload.prefixes`):
    its conversation's system prompt (text of the simulated length, the same text wherever it recurs,
    :func:`boute.workload.synthetic_text.text_of_tokens`), then, for a later turn, the previous turn's chat
    and the answer its client got (``answers``), then its own prompt (:func:`replay_messages`; a recorded next
    turn, MT-Bench's turn 2 after its turn 1, as its prompt alone, the earlier turn being the chat before it).
    The gateway routes on the last user message, so the route is the one the promise assumed. That message is
    the profile's prompt of the query: for MT-Bench's turn 2 both questions, as the judges' files record it
    and the router was trained on, so it repeats turn 1's question (tens of tokens) after the history."""
    from boute.workload.synthetic_text import text_of_tokens

    p = w.prefixes
    assert p is not None
    roots = scenario.workload.prefixes is not None and scenario.workload.prefixes.system_prompts is not None
    chats: list[list[dict[str, str]]] = []
    systems: dict[int, str] = {}  # root node -> its text, drawn once however often it opens a conversation
    for i, r in enumerate(rows):
        prev = p.previous(i)
        if prev >= 0:
            assert answers is not None
            head = [*chats[prev], {"role": "assistant", "content": answers[prev]}]
        elif roots:
            root = int(p.prompt_node[i])
            while p.parent[root] >= 0:
                root = int(p.parent[root])
            if root not in systems:
                systems[root] = text_of_tokens(root, int(p.tokens[root]))
            head = [{"role": "system", "content": systems[root]}]
        else:
            head = []
        own = (
            [{"role": "user", "content": profile.prompts[int(r)]}]  # the recorded next turn: its history is the head
            if prev >= 0 and profile.continues(int(r), int(rows[prev]))
            else replay_messages(profile, int(r))
        )
        chats.append(head + own)
    return chats


def cap_max_tokens(body: dict[str, Any], cap: int | None) -> bool:
    """Lower (or set, where it asks for none) the request's ``max_tokens`` to ``cap``; True if it changed."""
    if cap is None or body.get("max_tokens", cap + 1) <= cap:
        return False
    body["max_tokens"] = cap
    return True


def earlier_turns(context: str, prompt: str) -> str:
    """What an engine prefills for a query beyond its prompt: the served ``context`` less the prompt's own
    text, found as what lies between their common prefix and common suffix (MT-Bench turn 2: the context is
    Q1, A1, Q2 and the prompt Q1, Q2, so this is the first answer A1). Empty when the context is the prompt."""
    if context == prompt:
        return ""
    head = 0
    limit = min(len(context), len(prompt))
    while head < limit and context[head] == prompt[head]:
        head += 1
    tail = 0
    while tail < limit - head and context[-1 - tail] == prompt[-1 - tail]:
        tail += 1
    return context[head : len(context) - tail].strip()


def replay_messages(profile: QualityProfile, row: int) -> list[dict[str, str]]:
    """The chat messages that replay profile row ``row``: its prompt as the last user message (what the
    gateway routes on and the replica knows the answer of), after the earlier turns of a multi-turn query as
    an assistant message (:func:`earlier_turns`), so the replica prefills about as many tokens as the
    simulator counted for it (``QualityProfile.served_prompts``). Before, MT-Bench's turn-2 queries were
    sent without their first exchange: 79 tokens a query on average instead of 268, and a pre-routed plan
    measured a P95 22% under its promise."""
    prompt = profile.prompts[row]
    earlier = earlier_turns(profile.served_prompts[row], prompt)
    last = {"role": "user", "content": prompt}
    return [{"role": "assistant", "content": earlier}, last] if earlier else [last]
