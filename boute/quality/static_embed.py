"""Static token embeddings distilled from the packaged MiniLM: a table lookup instead of a transformer.

Why: running MiniLM costs ~15-20 ms of CPU per prompt, so a gateway core could route only ~55 prompts/s
(issue 11). A *static* embedding is MiniLM's output for every vocabulary token, computed once offline
(model2vec's ``distill``: one forward pass per token, then PCA to 256 dimensions); a prompt's embedding
is the mean of its tokens' rows, unit-normalised. Scoring a prompt costs one ``tokenizers`` call plus a
gather over a few dozen rows: ~0.2 ms of CPU, and nothing but numpy + ``tokenizers`` is imported, so the
gateway starts light (no torch, no transformers).

The encoding below is model2vec's ``StaticModel.encode`` recipe (no special tokens, unknown tokens dropped,
text cut at ``max_tokens`` x the median token length before tokenising, mean, L2 norm), written out so
one live prompt does not pay that class's batching machinery; tests check both agree.

Distillation needs torch + transformers + model2vec and takes 1-4 minutes on two shared cores (70 s
quiet, 240 s at load average 6: one MiniLM pass per vocabulary token, 29.5k of them); its result is
cached under ``$BOUTE_CACHE_DIR/static/<key>/`` (``table.npy`` float16, ``tokenizer.json``, ``info.json``),
the key hashing the MiniLM fingerprint, model2vec's version and the distillation settings. ``make install``
distils it ahead (``python -m boute.optimize.prepare``), so a first search does not. A router trained on it
keeps the table and tokenizer beside its weights, named by their content (:meth:`StaticEmbedder.save_shared`:
the routers of one folder share one copy; see :mod:`boute.quality.router`), so the cache is only a build-time
convenience.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from boute.errors import SpecError
from boute.specs.io import sha256_file, write_atomic

TABLE_FILE, TOKENIZER_FILE, INFO_FILE = "table.npy", "tokenizer.json", "info.json"
#: characters other than printable ASCII plus tab/newline/return: the word-cache path takes them only where
#: the tokenizer treats them as the split below does (:meth:`StaticEmbedder.word_char`)
_NOT_ASCII = re.compile(r"[^\x09\x0a\x0d\x20-\x7e]")
#: BERT's pre-tokenizer on such text: runs of letters/digits, every other printable character alone
_ASCII_WORDS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9\s]")
#: words whose WordPiece ids are remembered (a bound, so odd traffic cannot grow it without limit)
WORD_CACHE = 200_000
#: non-ASCII characters whose treatment is remembered (:meth:`StaticEmbedder.word_char`)
CHAR_CACHE = 16384


@dataclass(frozen=True)
class StaticSettings:
    """Distillation + encoding settings; all but ``max_tokens`` change the table (and the cache key).

    ``pca_dims``: model2vec's PCA target (None keeps MiniLM's 384 dimensions, un-rotated);
    ``sif_coefficient``: SIF weight a / (a + p(token)) with Zipf-estimated p (None = no weighting).

    Defaults: PCA to 256, no SIF. Chosen among eight combinations of PCA 128/256/384/none and SIF
    1e-4/1e-3/none by the router's APGR in repeated 5-fold CV inside the GSM8K and MT-Bench training
    splits and the mean over five seeded splits (docs/quality.md). Dropping model2vec's default SIF
    weighting (which shrinks frequent tokens) gained 0.015-0.023 APGR on GSM8K under both criteria; PCA
    256 vs none was a tie, and 256 dimensions keep the table at 15 MB instead of 23.
    """

    pca_dims: int | None = 256
    sif_coefficient: float | None = None
    max_tokens: int = 512

    def key(self) -> str:
        from importlib.metadata import version

        from boute.quality.embed import model_fingerprint

        raw = json.dumps([model_fingerprint(), version("model2vec"), self.pca_dims, self.sif_coefficient])
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


class StaticEmbedder:
    """Mean of distilled token vectors, unit norm. ``embed_one`` is the live-request path."""

    def __init__(
        self, table: np.ndarray, tokenizer_json: str, *, max_tokens: int = 512, info: dict[str, Any] | None = None
    ) -> None:
        from tokenizers import Tokenizer

        if table.ndim != 2:
            raise ValueError(f"static table must be 2-D, got shape {table.shape}")
        self.table = table  # as stored (float16): what `save` writes and the hashes cover
        self._rows = np.ascontiguousarray(table, dtype=np.float32)  # gathers + sums in float32
        self.tokenizer_json = tokenizer_json
        self.max_tokens = max_tokens
        self.info = dict(info or {})  # provenance (source model, model2vec version, settings), for metadata
        tok = Tokenizer.from_str(tokenizer_json)
        tok.no_padding()
        tok.enable_truncation(max_length=max_tokens)
        self._tok = tok
        unk = getattr(tok.model, "unk_token", None)
        self._unk = tok.token_to_id(unk) if unk else None
        vocab = tok.get_vocab()
        if max(vocab.values(), default=-1) >= table.shape[0]:
            raise ValueError(f"tokenizer has ids up to {max(vocab.values())}, table only {table.shape[0]} rows")
        # model2vec's guard against huge inputs: never tokenise more characters than max_tokens could use
        self._max_chars = max_tokens * int(np.median([len(t) for t in vocab]))
        # the live path's shortcut, only for the standard uncased BERT pipeline (what MiniLM ships)
        spec = json.loads(tokenizer_json)
        self._bert_uncased = (
            (spec.get("normalizer") or {}).get("type") == "BertNormalizer"
            and bool(spec["normalizer"].get("lowercase"))
            and (spec.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer"
            and spec.get("model", {}).get("type") == "WordPiece"
        )
        self._words: dict[str, list[int]] = {}
        self._chars: dict[str, bool] = {}
        # added (special) tokens such as "[CLS]" are matched in the raw text before the pipeline runs:
        # a text containing the first character of one goes to the tokenizer
        self._special_starts = "".join(sorted({t["content"][0] for t in spec.get("added_tokens", []) if t["content"]}))

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def ids(self, text: str) -> list[int]:
        """Token ids (unknown tokens dropped), exactly as the tokenizer gives them.

        Printable-ASCII text under the uncased BERT pipeline (and such text with the Unicode spaces and
        punctuation :meth:`word_char` admits) is split and lower-cased here and each word's WordPiece ids come
        from a cache filled by the tokenizer itself: ~15 us instead of ~80 us per prompt for the
        Python-to-Rust call and its offsets, which is most of a live score. Anything else (accented or other
        non-ASCII letters, symbols, control characters) goes to the tokenizer; ``tests/test_router_fast.py``
        checks both paths agree on every profile prompt and on random texts."""
        text = text[: self._max_chars]
        if (
            not self._bert_uncased
            or not all(map(self.word_char, set(_NOT_ASCII.findall(text))))  # none: all() of nothing is True
            or any(c in text for c in self._special_starts)
        ):
            ids = self._tok.encode(text, add_special_tokens=False).ids
        else:
            ids = []
            words, limit = self._words, self.max_tokens
            for w in _ASCII_WORDS.findall(text.lower()):
                got = words.get(w)
                if got is None:
                    if len(words) >= WORD_CACHE:
                        words.clear()
                    got = words[w] = self._tok.encode(w, add_special_tokens=False).ids
                ids.extend(got)
                if len(ids) >= limit:  # the tokenizer truncates before unknown tokens are dropped
                    del ids[limit:]
                    break
        if self._unk is not None and self._unk in ids:
            ids = [i for i in ids if i != self._unk]
        return ids

    def word_char(self, c: str) -> bool:
        """Whether the tokenizer treats the non-ASCII character ``c`` as the word-cache split does, asked of the
        tokenizer itself once per character: ``"a" + c + "a"`` tokenised whole must equal its split words
        tokenised one by one.

        Why a probe and not a rule: BERT's normaliser maps white space to a space, drops control characters,
        lower-cases, strips accents (NFD, then drops ``Mn``) and pads CJK ideographs with spaces, and its
        pre-tokenizer isolates punctuation, all by the Unicode tables of the ``tokenizers`` build, which lag
        Python's (punctuation added in Unicode 14 is a letter to it). Each step acts on ``c`` alone, so a
        character that the probe shows merging with its neighbours (a letter, a symbol such as ``€``), vanishing
        (a control or format character) or changing goes to the tokenizer, and one shown isolated (curly
        quotes, dashes, CJK) or a separator (no-break space) is safe for the split anywhere in a text."""
        known = self._chars.get(c)
        if known is None:
            if len(self._chars) >= CHAR_CACHE:
                self._chars.clear()
            probe, enc = f"a{c}a", self._tok.encode
            split = [i for w in _ASCII_WORDS.findall(probe.lower()) for i in enc(w, add_special_tokens=False).ids]
            known = self._chars[c] = enc(probe, add_special_tokens=False).ids == split
        return known

    def embed_one(self, text: str) -> np.ndarray:
        """(dim,) float32 unit vector (zeros for a text with no known token); bit-identical to ``embed``."""
        return self._unit_mean(self.ids(text))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, each text exactly as :meth:`embed_one` gives it: a live prompt scores
        as it did in the batch the thresholds were cut on (and the per-word cache makes this the fast way
        for a batch too)."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i] = self._unit_mean(self.ids(t))
        return out

    def _unit_mean(self, ids: list[int]) -> np.ndarray:
        """Mean of the ids' rows, L2-normalised, in float32 (zeros for no ids): ~8 us for 100 tokens."""
        if not ids:
            return np.zeros(self.dim, dtype=np.float32)
        # np.add.reduce and sqrt(x . x) are what ndarray.sum and np.linalg.norm compute for a 1-D float32
        # vector, without their Python wrappers (~3 us of the ~12 us here)
        mean = np.add.reduce(self._rows[np.array(ids, dtype=np.intp)], axis=0) / np.float32(len(ids))
        return mean / (np.sqrt(mean.dot(mean)) + np.float32(1e-30))

    # ------------------------------------------------------------------------------------------- files
    def save(self, table_path: Path, tokenizer_path: Path) -> None:
        """Write the table (``.npy``, no pickle) and the tokenizer, each atomically."""
        write_atomic(table_path, lambda fh: np.save(fh, self.table, allow_pickle=False))
        write_atomic(tokenizer_path, self.tokenizer_json)

    def save_shared(self, folder: Path) -> dict[str, tuple[Path, str]]:
        """Write the table and tokenizer into ``folder`` under names taken from their content,
        ``static-<hash>.npy`` and ``static-<hash>.tokenizer.json``, unless files with that content are there
        already: every router and verifier saved in one folder with this embedder shares one 15 MB table (the
        cache's ``routers/`` held a copy per router before). Returns ``{role: (path, sha256)}`` for the
        ``table`` and ``tokenizer`` roles a saved model's metadata lists."""
        table = io.BytesIO()
        np.save(table, self.table, allow_pickle=False)
        blobs = {"table": table.getvalue(), "tokenizer": self.tokenizer_json.encode()}
        digests = {role: hashlib.sha256(blob).hexdigest() for role, blob in blobs.items()}
        stem = "static-" + hashlib.sha256((digests["table"] + digests["tokenizer"]).encode()).hexdigest()[:16]
        out: dict[str, tuple[Path, str]] = {}
        for role, suffix in (("table", ".npy"), ("tokenizer", ".tokenizer.json")):
            path = folder / f"{stem}{suffix}"
            blob, digest = blobs[role], digests[role]
            if not (path.is_file() and path.stat().st_size == len(blob) and sha256_file(path) == digest):
                write_atomic(path, blob)  # atomic: a reader of another model sharing it sees the same bytes
            out[role] = (path, digest)
        return out

    @classmethod
    def load(
        cls, table_path: Path, tokenizer_path: Path, *, max_tokens: int = 512, info: dict[str, Any] | None = None
    ) -> StaticEmbedder:
        try:
            table = np.load(table_path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise SpecError(table_path, None, f"not a static embedding table ({exc})") from None
        try:
            return cls(table, tokenizer_path.read_text(), max_tokens=max_tokens, info=info)
        except Exception as exc:  # tokenizers raises plain Exceptions for malformed JSON
            raise SpecError(tokenizer_path, None, f"unusable tokenizer ({str(exc).splitlines()[0]})") from None


def static_dir(settings: StaticSettings, cache_dir: Path | str | None = None) -> Path:
    from boute.data import cache_dir as default_cache_dir

    return Path(cache_dir or default_cache_dir()) / "static" / settings.key()


#: keys of a saved model's ``embedder`` metadata that describe its layout, not the table's provenance
_LAYOUT_KEYS = ("kind", "max_tokens", "dim", "response_tail_chars")


def static_from_metadata(files: dict[str, Path], embedder: dict[str, Any]) -> StaticEmbedder:
    """The static embedder a saved router or verifier names: its ``table`` and ``tokenizer`` files (hashes
    checked by the caller), the ``max_tokens`` it embedded with, the rest of its metadata as provenance."""
    info = {k: v for k, v in embedder.items() if k not in _LAYOUT_KEYS}
    max_tokens = int(embedder.get("max_tokens", 512))
    return StaticEmbedder.load(files["table"], files["tokenizer"], max_tokens=max_tokens, info=info)


def load_static(settings: StaticSettings | None = None, cache_dir: Path | str | None = None) -> StaticEmbedder:
    """The distilled embedder for ``settings``: from the cache, distilling it first if it is not there."""
    from boute.data.builds import building

    settings = settings or StaticSettings()
    d = static_dir(settings, cache_dir)
    if not all((d / f).is_file() for f in (TABLE_FILE, TOKENIZER_FILE, INFO_FILE)):
        with building("static"):
            distill_static(settings, cache_dir)
    info = json.loads((d / INFO_FILE).read_text())
    return StaticEmbedder.load(d / TABLE_FILE, d / TOKENIZER_FILE, max_tokens=settings.max_tokens, info=info)


def distill_static(settings: StaticSettings | None = None, cache_dir: Path | str | None = None) -> dict[str, Any]:
    """Distil the packaged MiniLM with model2vec (offline, CPU) into the cache; returns ``info.json``.

    Deterministic for a given machine and library versions (CPU forward passes, eigendecomposition PCA,
    float16 output): the same settings give the same table bytes, so the router's hashes are stable.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from importlib.metadata import version

    from model2vec.distill import distill

    from boute.quality.embed import MODEL_NAME, model_dir, model_fingerprint

    settings = settings or StaticSettings()
    target = static_dir(settings, cache_dir)
    t0 = time.perf_counter()
    model = distill(
        str(model_dir()),
        pca_dims=settings.pca_dims,
        sif_coefficient=settings.sif_coefficient,
        quantize_to="float16",
        device="cpu",
    )
    seconds = time.perf_counter() - t0
    emb = StaticEmbedder(np.asarray(model.embedding, dtype=np.float16), model.tokenizer.to_str())
    info = {
        "source": MODEL_NAME,
        "model_fingerprint": model_fingerprint(),
        "model2vec": version("model2vec"),
        "settings": asdict(settings),
        "shape": list(emb.table.shape),
        "distill_seconds": round(seconds, 1),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        emb.save(tmp / TABLE_FILE, tmp / TOKENIZER_FILE)
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # a shared cache: mkdtemp's 0700 would hide it from other users
        try:
            os.replace(tmp, target)
        except OSError:  # another process distilled the same table meanwhile: keep theirs
            if not (target / TABLE_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info
