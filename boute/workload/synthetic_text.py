"""Text of a given token count, for prompt parts a workload draws but no dataset holds (system prompts).

Why: ``boute verify`` replays the workload the plan was judged on through real HTTP, so a system prompt the
simulator counted as 1,800 tokens must reach the replicas as 1,800 tokens of text, the same text every time
it recurs (that is what their prefix caches hit), and different text for a different system prompt. Words
are drawn, seeded by the prompt's id, from the tokenizer's own whole-word vocabulary entries that it keeps
as one token each (:mod:`boute.workload.tokens`), so ``count_tokens`` of the text is exactly the count asked.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from boute.workload.tokens import count_tokens


@lru_cache(maxsize=1)
def _words() -> tuple[str, ...]:
    """Lower-case alphabetic words of 4-10 letters that the tokenizer keeps whole: one token each, checked."""
    from boute.workload.tokens import _tokenizer

    vocab = sorted(w for w in _tokenizer().get_vocab() if w.isalpha() and w.islower() and 4 <= len(w) <= 10)
    counts = count_tokens(vocab)
    return tuple(w for w, c in zip(vocab, counts, strict=True) if c == 1)


def text_of_tokens(seed: int, tokens: int) -> str:
    """``tokens`` space-separated words drawn with ``seed``: ``count_tokens([text]) == [tokens]``."""
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    words = _words()
    picks = np.random.default_rng([seed, tokens]).integers(0, len(words), size=tokens)
    return " ".join(words[i] for i in picks)
