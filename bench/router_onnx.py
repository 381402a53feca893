"""MiniLM exported to ONNX with int8 weights: one of the ways ``bench_router_speed`` makes scoring fast.

Here because building it (export, dynamic quantisation, a one-thread session) is a job of its own; the
benchmark only embeds with it and compares the embeddings with torch's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np


class OnnxMiniLM:
    """MiniLM through ONNX Runtime with int8 weights (dynamic quantisation), one thread."""

    def __init__(self, workdir: Path) -> None:
        import onnxruntime as ort
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic

        from boute.quality.embed import _load

        tok, bert = _load(256, "right")
        self.tok = tok

        class _Wrap(torch.nn.Module):  # keyword call: transformers 5 changed BertModel's positional order
            def __init__(self, m: Any) -> None:
                super().__init__()
                self.m = m

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
                return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)[0]

        t0 = time.perf_counter()
        fp32, int8 = workdir / "minilm.onnx", workdir / "minilm.int8.onnx"
        ids = torch.ones(1, 8, dtype=torch.long)
        axes = {0: "batch", 1: "seq"}
        torch.onnx.export(
            _Wrap(bert).eval(),
            (ids, ids, torch.zeros_like(ids)),
            str(fp32),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["hidden"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes, "hidden": axes},
            opset_version=17,
            dynamo=False,
        )
        quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
        self.build_s = time.perf_counter() - t0
        self.size_mb = int8.stat().st_size / 1e6
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.sess = ort.InferenceSession(str(int8), so, providers=["CPUExecutionProvider"])

    def embed(self, texts: list[str]) -> np.ndarray:
        """Mean-pooled, unit-norm embeddings (the Embedder's recipe), texts padded to the longest."""
        encs = self.tok.encode_batch([t if t.strip() else "." for t in texts])
        width = max(len(e.ids) for e in encs)
        ids = np.zeros((len(encs), width), np.int64)
        mask = np.zeros_like(ids)
        for r, e in enumerate(encs):
            ids[r, : len(e.ids)], mask[r, : len(e.ids)] = e.ids, 1
        (hidden,) = self.sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": 0 * ids})
        m = mask[:, :, None].astype(np.float32)
        pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    def embed_all(self, texts: list[str], batch: int = 16) -> np.ndarray:
        order = np.argsort([len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), 384), np.float32)
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            out[idx] = self.embed([texts[i] for i in idx])
        return out
