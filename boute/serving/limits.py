"""The context-length rule of a serving engine, shared by the gateway and the emulated backend.

Why a rule at all: a request whose input plus ``max_tokens`` cannot fit the model's context can never be
answered as asked, and one asking for 10^8 tokens, if accepted, occupies a replica for as long as it is
allowed to run (issue 28: it took a whole tier down). SGLang refuses such a request up front with 400
(``TokenizerManager._validate_one_request``: the input alone reaching the context length, or input +
``max_new_tokens`` above it), and so does OpenAI (400 ``context_length_exceeded``). The messages below are
SGLang's, so a client sees the same text whichever layer refused.

Two layers apply it. The emulated backend counts its own tokens (4-character pieces), as SGLang counts
with the model's tokenizer. The gateway has no tokenizer: it takes a lower bound of the input's tokens
(:func:`min_tokens`), so it refuses only what the replica would refuse too, and the replica catches the
rest with the same 400.
"""

from __future__ import annotations

#: characters one token spans at most, for a lower bound of a text's tokens without its tokenizer. English
#: averages ~4 with Llama-3's tokenizer and code ~3; only long runs of one repeated character (whitespace,
#: dashes) pack more, and such input is the one case where the gateway's bound can be above the true count.
MAX_CHARS_PER_TOKEN = 8


def min_tokens(chars: int) -> int:
    """A lower bound of the tokens of a text of ``chars`` characters (see :data:`MAX_CHARS_PER_TOKEN`)."""
    return chars // MAX_CHARS_PER_TOKEN


def context_error(
    input_tokens: int, max_new_tokens: int | None, context: int, *, estimated: bool = False
) -> str | None:
    """Why a request of ``input_tokens`` asking for ``max_new_tokens`` (None: not set) cannot fit a
    ``context``-token model, in SGLang's words; None when it fits. ``estimated``: ``input_tokens`` is a lower
    bound (the gateway's), and the message says "at least"."""
    least = "at least " if estimated else ""
    if input_tokens >= context:
        return f"The input ({least}{input_tokens} tokens) is longer than the model's context length ({context} tokens)."
    if max_new_tokens is not None and input_tokens + max_new_tokens > context:
        return (
            f"Requested token count exceeds the model's maximum context length of {context} tokens. "
            f"You requested a total of {least}{input_tokens + max_new_tokens} tokens: {least}{input_tokens} tokens "
            f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce the number "
            "of tokens in the input messages or the completion to fit within the limit."
        )
    return None


__all__ = ["MAX_CHARS_PER_TOKEN", "context_error", "min_tokens"]
