"""Packaged example scenarios (YAML files beside this module)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from boute.errors import SpecError


def builtin_scenarios() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def builtin_scenario_path(name: str) -> Path:
    p = Path(str(resources.files(__name__) / f"{name}.yaml"))
    if not p.is_file():
        raise SpecError(f"builtin:{name}", None, f"no such built-in scenario (known: {', '.join(builtin_scenarios())})")
    return p
