"""GPU and model catalogs: packaged YAML data files, extendable from a scenario file."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from boute.catalog.schema import Efficiency, GPUSpec, ModelSpec
from boute.errors import SpecError, from_validation_error

__all__ = ["Catalog", "Efficiency", "GPUSpec", "ModelSpec", "builtin_catalog"]


@dataclass(frozen=True)
class Catalog:
    """Immutable lookup of GPU types and model architectures by name."""

    gpus: MappingProxyType[str, GPUSpec] = field(default_factory=lambda: MappingProxyType({}))
    models: MappingProxyType[str, ModelSpec] = field(default_factory=lambda: MappingProxyType({}))

    def gpu(self, name: str) -> GPUSpec:
        try:
            return self.gpus[name]
        except KeyError:
            raise KeyError(f"unknown GPU '{name}' (known: {', '.join(sorted(self.gpus))})") from None

    def model(self, name: str) -> ModelSpec:
        try:
            return self.models[name]
        except KeyError:
            raise KeyError(f"unknown model '{name}' (known: {', '.join(sorted(self.models))})") from None

    def extended(
        self,
        gpus: list[GPUSpec] | tuple[GPUSpec, ...] = (),
        models: list[ModelSpec] | tuple[ModelSpec, ...] = (),
    ) -> Catalog:
        """A copy with user GPUs/models added (a user entry replaces a packaged one of the same name)."""
        return Catalog(
            gpus=MappingProxyType({**self.gpus, **{g.name: g for g in gpus}}),
            models=MappingProxyType({**self.models, **{m.name: m for m in models}}),
        )


def _load_entries(text: str, source: str, kind: type[BaseModel], key: str) -> list[Any]:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(source, None, f"malformed YAML: {exc}".splitlines()[0]) from None
    if not isinstance(raw, dict) or not isinstance(raw.get(key), list):
        raise SpecError(source, key, f"expected a top-level '{key}:' list")
    out = []
    for i, entry in enumerate(raw[key]):
        try:
            out.append(kind.model_validate(entry))
        except ValidationError as exc:
            raise from_validation_error(exc, source, prefix=f"{key}[{i}]") from None
    return out


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    """The packaged catalog (``boute/catalog/gpus.yaml`` and ``models.yaml``)."""
    pkg = resources.files("boute.catalog")
    gpus = _load_entries((pkg / "gpus.yaml").read_text(), "boute/catalog/gpus.yaml", GPUSpec, "gpus")
    models = _load_entries((pkg / "models.yaml").read_text(), "boute/catalog/models.yaml", ModelSpec, "models")
    return Catalog().extended(gpus, models)


def load_catalog_file(path: str | Path) -> Catalog:
    """A user catalog file with optional ``gpus:`` and ``models:`` lists, on top of the packaged one."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(p, None, f"cannot read file: {exc.strerror}") from None
    raw = yaml.safe_load(text) or {}
    gpus = _load_entries(text, str(p), GPUSpec, "gpus") if "gpus" in raw else []
    models = _load_entries(text, str(p), ModelSpec, "models") if "models" in raw else []
    return builtin_catalog().extended(gpus, models)
