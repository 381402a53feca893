"""The llama.cpp engine build: instruction sets chosen per CPU (never AMX), and a crash caught by the probe."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from backends.llamacpp.build import cpu_flags, feature_sets, probe_engine

SAPPHIRE_RAPIDS = (
    "flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512cd avx512bw avx512dq avx512vl avx512vbmi "
    "avx512_vnni avx512_bf16 avx512_fp16 amx_tile amx_int8 amx_bf16\n"
)


def test_amx_is_never_switched_on_and_avx512_comes_first() -> None:
    sets = feature_sets(cpu_flags(SAPPHIRE_RAPIDS), machine="x86_64")
    assert [s.key for s in sets] == ["avx512-vbmi-vnni-bf16", "avx2", "generic"]
    for s in sets:
        args = s.cmake_args()
        assert "-DGGML_NATIVE=OFF" in args  # -march=native would switch AMX on
        assert all(f"-DGGML_AMX_{k}=OFF" in args for k in ("TILE", "INT8", "BF16"))
        assert "AMX" not in " ".join(s.on)
    assert "-DGGML_AVX512=ON" in sets[0].cmake_args() and "-DGGML_AVX512=OFF" in sets[1].cmake_args()


def test_cpu_without_avx512_or_avx2() -> None:
    avx2_only = cpu_flags("flags : sse4_2 avx avx2 fma f16c bmi2\n")
    assert [s.key for s in feature_sets(avx2_only, machine="x86_64")] == ["avx2", "generic"]
    old = cpu_flags("flags : sse4_2 avx\n")
    assert [s.key for s in feature_sets(old, machine="x86_64")] == ["generic"]
    assert [s.key for s in feature_sets(frozenset(), machine="aarch64")] == ["generic"]


@pytest.mark.timeout(120)  # starts processes
def test_probe_reports_a_crash_of_the_engine(tmp_path: Path) -> None:
    """A child killed by a signal (what a bad instruction or AMX's fault does) is reported, not raised."""
    crashing = tmp_path / "python"
    crashing.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crashing.chmod(crashing.stat().st_mode | stat.S_IEXEC)
    reason = probe_engine(str(crashing), gguf=tmp_path / "model.gguf", timeout_s=30)
    assert reason is not None and "SIGSEGV" in reason
    failing = tmp_path / "python-fails"
    failing.write_text("#!/bin/sh\necho 'ImportError: no llama_cpp' >&2\nexit 1\n")
    failing.chmod(failing.stat().st_mode | stat.S_IEXEC)
    reason = probe_engine(str(failing), gguf=tmp_path / "model.gguf", timeout_s=30)
    assert reason is not None and "exit 1" in reason and "ImportError" in reason
