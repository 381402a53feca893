"""Data shipped with BOute (real, with licences): RouteLLM quality evals and the Azure LLM trace.

``builtin:NAME`` references in scenario files resolve here.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from boute.errors import SpecError

BUILTIN_FILES: dict[str, str] = {
    "gsm8k": "routellm/gsm8k_responses.csv",
    "mt-bench": "routellm/mt_bench_judgements.jsonl",
    "gsm8k-test": "routellm/gsm8k_test.jsonl",
    "azure-conv": "azure-llm-trace-2023/conv.csv",
}


def cache_dir() -> Path:
    """Where BOute keeps what it derives from data and may build again (token counts, embeddings, trained
    routers and verifiers, fetched plan files): ``$BOUTE_CACHE_DIR``, else ``~/.cache/boute``."""
    env = os.environ.get("BOUTE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "boute"


def data_path(ref: str, base: Path | None = None) -> Path:
    """Resolve ``builtin:NAME`` to a packaged file, or a path relative to ``base``."""
    if ref.startswith("builtin:"):
        name = ref.split(":", 1)[1]
        if name not in BUILTIN_FILES:
            raise SpecError(None, None, f"unknown built-in data '{ref}' (known: {', '.join(BUILTIN_FILES)})")
        return Path(str(resources.files(__name__) / BUILTIN_FILES[name]))
    p = Path(ref)
    if not p.is_absolute() and base is not None:
        p = base / p
    return p
