"""Stand-ins for two imports SGLang makes that cannot be satisfied on a CPU-only host (installed by ``make sglang``).

This file is copied into the SGLang virtualenv's site-packages as ``_boute_sglang_standins.py`` and loaded by a
``.pth`` line; it is not imported by BOute itself. Each stand-in is a module that imports, so SGLang's
module-level ``import`` lines succeed, and raises :class:`StandInUsed` the moment anything inside it is
*used* (called, instantiated, subscripted): a code path that really needs the library fails loudly, naming it,
instead of computing with a fake.

- ``sgl_kernel`` (PyPI ``sglang-kernel``): ships CUDA builds only. SGLang's CPU path (``--device cpu
  --attention-backend torch_native``) imports it at module level in shared files but never calls it there.
- ``torchvision``: PyPI's wheel is built against its own torch and fails to load beside the CPU torch 2.13.0
  this venv pins (``operator torchvision::nms does not exist``). SGLang imports it only for multimodal
  configs (InternVL image transforms), which a text model never touches.

The finder is appended to ``sys.meta_path``: a real installation of either package, if one ever exists,
is found first and wins.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

STANDINS: dict[str, str] = {
    "sgl_kernel": "sglang-kernel ships CUDA builds only",
    "torchvision": "PyPI's torchvision does not load beside CPU torch 2.13.0",
}


class StandInUsed(RuntimeError):
    """Raised when SGLang really uses a stood-in library on the path it took."""


class _Placeholder:
    """Any attribute of a stand-in: importable and nameable, unusable."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        root = self._qualname.split(".", 1)[0]
        raise StandInUsed(f"{self._qualname} was used, but {root} is a BOute stand-in ({STANDINS[root]})")

    __call__ = _fail
    __getitem__ = _fail
    __iter__ = _fail

    def __getattr__(self, name: str) -> _Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._qualname}.{name}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)  # ``class Foo(torchvision.X):`` at module level still defines a class

    def __repr__(self) -> str:
        return f"<BOute stand-in {self._qualname}>"


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _StandInModule(spec.name)
        mod.__path__ = []  # a package: every submodule import comes back here
        mod.__version__ = "0.0.0+boute-standin"  # type: ignore[attr-defined]
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] not in STANDINS:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())
