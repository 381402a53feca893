"""What an emulated replica is (model, GPU, TP, PP, profile column) and what it answers.

Known prompts (exact text of a quality profile's prompt) get that model's recorded response, so a
gateway's routing decisions produce the answers, and hence the quality, the profile measured. Anything
else gets filler text of the requested length (4-character pieces). Tokens are counted, and a recorded
answer is streamed piece by piece, with the one token counter the simulator's workload uses
(:mod:`boute.workload.tokens`), so a replica generates as many tokens for an answer as the promise it is
checked against assumed. Before, a 4-characters-per-token rule here beside that counter made GSM8K's
Mixtral answers 26% shorter and MT-Bench's 11% longer than the simulator's; the pieces reassemble the
exact text either way.
"""

from __future__ import annotations

import math
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from boute.errors import SpecError

CHARS_PER_TOKEN = 4
#: the chat template, as token pieces, Llama-3's shape with its header tail fused into one token: the prompt
#: opens with :data:`CHAT_BEGIN`, each message is its header, its content and :data:`CHAT_END`, and the
#: generation prompt is the assistant's header. The assistant's turn in a later request is that same header
#: followed by the answer, so a conversation's next turn repeats the previous prompt and answer token for
#: token and hits the prefix cache through the answer, as with SGLang's real template.
CHAT_BEGIN = ("<|begin_of_text|>",)
CHAT_END = "<|eot_id|>"
#: template tokens of a one-message chat (begin, header + end, generation prompt); each further message adds
#: :data:`CHAT_MESSAGE_TOKENS`
CHAT_TEMPLATE_TOKENS = 8
CHAT_MESSAGE_TOKENS = 4
FILLER = (
    "This is emulated output from a BOute test backend; the prompt was not in the quality profile, "
    "so the text only has the right length. "
)


class ReplicaConfig(BaseModel):
    """One emulated replica: hardware for timing, profile column for answers, where it listens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    gpu: str
    tp: PositiveInt = 1
    pp: PositiveInt = 1
    dtype: str = "bf16"
    port: int = 0
    host: str = "127.0.0.1"
    served_model_name: str | None = None
    profile: str | None = Field("builtin:gsm8k", description="quality profile whose responses are replayed")
    profile_model: str | None = Field(None, description="the profile's model column (None: filler only)")
    speedup: PositiveFloat = 1.0
    catalog: str | None = Field(None, description="catalog file (the plan's GPUs/models, calibrated); else packaged")
    default_output_tokens: PositiveInt = 128
    max_running: PositiveInt = 256
    enable_cache_report: bool = Field(
        False, description="SGLang's --enable-cache-report: usage.prompt_tokens_details.cached_tokens (else null)"
    )

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


@lru_cache(maxsize=8)
def load_responses(profile: str, column: str) -> dict[str, str]:
    """prompt -> recorded response of model ``column`` in a quality profile (any format that records
    answers: RouteLLM CSV, MT-Bench judgements, JSONL); empty when the profile records none for it."""
    from boute.quality.profiles import load_profile

    prof = load_profile(profile)
    if column not in prof.models:
        raise SpecError(profile, column, f"no such model in the profile (has: {', '.join(prof.models)})")
    answers = prof.responses.get(column)
    if answers is None:
        return {}
    return {p.strip(): a for p, a in zip(prof.prompts, answers, strict=True) if a}


@lru_cache(maxsize=8192)
def pieces(text: str) -> tuple[str, ...]:
    """The tokens a recorded answer is generated as (:func:`boute.workload.tokens.token_pieces`)."""
    from boute.workload.tokens import token_pieces

    return tuple(token_pieces(text))


@lru_cache(maxsize=4096)
def prompt_pieces(text: str) -> tuple[str, ...]:
    """A prompt's (or a message's) tokens as pieces, by the simulator's counter: what its prefix-cache path
    is cut from. Memoised apart from :func:`pieces` and smaller: a prompt's pieces weigh ~50 bytes a token."""
    from boute.workload.tokens import token_pieces

    return tuple(token_pieces(text))


@lru_cache(maxsize=16384)
def count_tokens(text: str) -> int:
    """Prompt tokens, by the simulator's counter (at least 1; ``len(prompt_pieces(text))``, which is 1 for a
    blank text too). Memoised: WordPiece takes ~1.1 ms of CPU for a 2,000-character RouterBench prompt, on the
    event loop that also times the replica's iterations, and a replay repeats its held-out prompts."""
    return len(prompt_pieces(text))


def chat_header(role: str) -> tuple[str, ...]:
    """A message's header: three tokens (Llama-3's ``<|start_header_id|>role<|end_header_id|>`` + two newlines,
    the last two fused)."""
    return ("<|start_header_id|>", role, "<|end_header_id|>\n\n")


def chat_pieces(messages: list[tuple[str, str]]) -> list[str]:
    """The tokens of a chat prompt, template included, for ``(role, content)`` messages: its length is the
    prompt's tokens (the contents' plus :data:`CHAT_TEMPLATE_TOKENS` for one message, plus
    :data:`CHAT_MESSAGE_TOKENS` per further one), and two chats that open with the same messages share
    their leading pieces (module constants)."""
    out = list(CHAT_BEGIN)
    for role, content in messages:
        out += chat_header(role)
        out += prompt_pieces(content)
        out.append(CHAT_END)
    out += chat_header("assistant")
    return out


class Responder:
    """Chooses the answer (as token pieces) for a prompt."""

    def __init__(self, cfg: ReplicaConfig) -> None:
        self.cfg = cfg
        self.known = load_responses(cfg.profile, cfg.profile_model) if cfg.profile and cfg.profile_model else {}

    def answer(self, prompt: str, max_tokens: int | None) -> tuple[list[str], bool]:
        """(pieces, truncated?) for the prompt, capped at ``max_tokens``."""
        recorded = self.known.get(prompt.strip())
        if recorded is not None:
            out = list(pieces(recorded))
        else:
            n = max_tokens or self.cfg.default_output_tokens
            reps = math.ceil(n * CHARS_PER_TOKEN / len(FILLER))
            text = (FILLER * reps)[: n * CHARS_PER_TOKEN]
            out = [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]
            return out, max_tokens is not None  # filler stops only because max_tokens does
        if max_tokens is not None and len(out) > max_tokens:
            return out[:max_tokens], True
        return out, False
