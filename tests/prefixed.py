"""Test support: a scenario like another with its workload's ``prefixes`` section (and other workload fields)
replaced, validated as a scenario file would be."""

from __future__ import annotations

from typing import Any

from boute.specs.io import validate
from boute.specs.scenario import Scenario


def with_prefixes(base: Scenario, prefixes: dict[str, Any] | None, **workload: Any) -> Scenario:
    data = base.model_dump()
    data["workload"] = {**data["workload"], "prefixes": prefixes, **workload}
    sc = validate(Scenario, data, "scenario.yaml")
    sc._source = base.source
    return sc
