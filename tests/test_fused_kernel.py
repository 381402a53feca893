"""BoTorch's fused log-hypervolume kernel: never compiled during a search, and the install-time build scores
as BoTorch's pure-PyTorch path does (boute/optimize/acquisition/fused_kernel.py).

Each case runs in a fresh interpreter, since BoTorch decides once per process whether it has the kernel.
``torch.utils.cpp_extension.load`` is replaced there by a recorder that refuses to compile, so a run-time
compile shows up as a recorded call instead of 25 s and a lock file in ``~/.cache/torch_extensions``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from boute.optimize.acquisition.fused_kernel import NAME

_SCRIPT = """
import importlib.abc, json, sys

class Hide(importlib.abc.MetaPathFinder):  # as on a machine where make install built no kernel
    def find_spec(self, name, path, target=None):
        if name == {name!r}:
            raise ImportError("hidden by the test")
        return None

if {hide!r}:
    sys.meta_path.insert(0, Hide())

import torch
import torch.utils.cpp_extension as ext

compiled = []

def refuse(*args, **kwargs):
    compiled.append(kwargs.get("name"))
    raise RuntimeError("compiled at run time")

ext.load = refuse
from botorch.acquisition.multi_objective import logei
from botorch.models import SingleTaskGP

from boute.optimize.acquisition.functions import log_nehvi

torch.manual_seed(0)
X = torch.rand(24, 5, dtype=torch.double)
q = (0.6 + 0.3 * X[:, :1]).clamp(max=0.99)
lat = -(X ** 2).sum(-1, keepdim=True) + 0.05 * torch.randn(24, 1, dtype=torch.double)
Z = torch.rand(40, 1, 5, dtype=torch.double)
scores = log_nehvi(SingleTaskGP(X, q), [SingleTaskGP(X, lat)], X, Z, ref=[0.6, -4.0], mc_samples=64, seed=3)
print(json.dumps({{"compiled": compiled, "fused": logei._C is not None, "scores": [float(s) for s in scores]}}))
"""


def _score(hide: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(name=NAME, hide=hide)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_botorch_never_compiles_its_kernel_during_a_search_without_the_install_time_build() -> None:
    got = _score(hide=True)
    assert got["compiled"] == []  # BoTorch alone would compile here (with -march=native, holding a lock)
    assert got["fused"] is False  # its pure-PyTorch path
    assert len(got["scores"]) == 40 and all(s == s for s in got["scores"])  # scored, no NaN


@pytest.mark.skipif(importlib.util.find_spec(NAME) is None, reason="make install built no fused kernel here")
def test_the_install_time_kernel_is_used_and_scores_as_the_pure_path_does() -> None:
    fused, pure = _score(hide=False), _score(hide=True)
    assert fused["compiled"] == [] and fused["fused"] is True
    for a, b in zip(fused["scores"], pure["scores"], strict=True):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9)
