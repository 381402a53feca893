"""BoTorch's fused C++ kernel for the log-hypervolume acquisitions: built once at install, never at run time.

BoTorch (0.18) speeds up ``qLogNEHVI``/``qLogEHVI`` with a C++ kernel (``botorch/csrc/logei_fused.cpp``): it
imports a prebuilt module ``logei_fused_ext`` if there is one, else compiles the source with
``torch.utils.cpp_extension.load`` the first time such an acquisition is built, with ``-march=native``,
into ``~/.cache/torch_extensions``. Measured here (2 cores): that compile takes 23-25 s, inside the user's
first search; it holds a lock file while it runs, and a search killed in that window (Ctrl-C) leaves the
lock behind, after which every later search on the machine waits on it for ever (seen in stop 47: a bench
hung in ``FileBaton.wait``); and a ``-march=native`` binary in a home directory shared by machines of
different CPUs (a cluster's NFS home, an image built on another host) dies with an illegal instruction.

So BOute takes the first branch and removes the second: ``make install`` compiles the same source once with
portable flags (:data:`FLAGS`) into the virtual environment as ``logei_fused_ext`` (:func:`build`), and
:func:`use_prebuilt`, called before any such acquisition is built, loads that module or else settles BoTorch
on its pure-PyTorch path, which computes the same values (``tests/test_fused_kernel.py`` checks both).
Scoring a pool of 800 plans with 128 MC samples: 0.66-0.78 s with this build, 0.57-0.86 s with BoTorch's
native one, 1.4-1.7 s on the pure path.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

#: the module name BoTorch imports before it would compile
NAME = "logei_fused_ext"
#: optimised for the baseline of the CPU's architecture only: runs on every CPU of its kind, no -march=native
FLAGS = ("-O3",)


def source() -> Path:
    """The kernel's C++ source as BoTorch ships it."""
    import botorch

    return Path(botorch.__file__).parent / "csrc" / "logei_fused.cpp"


def use_prebuilt() -> bool:
    """Load the install-time build into BoTorch, or settle it on its pure-PyTorch path; never compile.

    Idempotent and cheap; True when the fused kernel is in use. Works through ``logei``'s module state
    (``_C``, ``_load_attempted``); if a BoTorch release renames it, nothing is changed here and the test
    that BoTorch never compiles at run time fails, which is where to look."""
    from botorch.acquisition.multi_objective import logei

    if not hasattr(logei, "_load_attempted") or not hasattr(logei, "_C"):
        return False
    if not logei._load_attempted:
        mod: ModuleType | None
        try:
            mod = importlib.import_module(NAME)  # built by make install
        except ImportError:
            mod = None
        setattr(logei, "_C", mod)  # noqa: B010  (BoTorch types it as None; it holds the module when loaded)
        logei._load_attempted = True
    return logei._C is not None


def build(dest: Path) -> Path:
    """Compile :func:`source` with :data:`FLAGS` and install it as ``dest/logei_fused_ext.so``.

    Built in a temporary directory (no lock or object files left in ``dest``), then moved into place under a
    temporary name first, so an interrupted build never leaves a half-written module to import."""
    from torch.utils.cpp_extension import load

    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="boute-kernel-") as tmp:
        mod = load(name=NAME, sources=[str(source())], extra_cflags=list(FLAGS), build_directory=tmp, verbose=False)
        built = Path(mod.__file__)
        part = dest / f".{NAME}.so.part"
        shutil.copyfile(built, part)
        os.replace(part, dest / f"{NAME}.so")
    return dest / f"{NAME}.so"


def main(argv: list[str]) -> int:
    """``python -m boute.optimize.acquisition.fused_kernel build [DIR]`` (make install): DIR defaults to this
    environment's site-packages. A failed build is reported and is not an error: the pure path is correct."""
    if argv[:1] != ["build"]:
        print("usage: python -m boute.optimize.acquisition.fused_kernel build [DIR]", file=sys.stderr)
        return 2
    dest = Path(argv[1]) if len(argv) > 1 else Path(sysconfig.get_paths()["platlib"])
    try:
        path = build(dest)
    except Exception as exc:  # no compiler, no headers: BoTorch's pure-PyTorch path stays in use
        print(f"BoTorch's fused kernel was not built ({type(exc).__name__}: {exc}); the pure path is used")
        return 0
    print(f"BoTorch's fused kernel built with {' '.join(FLAGS)}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
