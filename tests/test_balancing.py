"""A scenario's balancing (boute/specs/scenario.py, boute/specs/balancing.py): the rule its plans are judged under
is the rule they carry to the gateway, and `boute optimize --affinity/--no-affinity` sets it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from boute.errors import SpecError
from boute.optimize.evaluators.base import candidate_plan
from boute.optimize.plan_run import PlanRequest
from boute.optimize.space import Candidate
from boute.specs import load_scenario
from boute.specs.balancing import Affinity
from boute.specs.io import validate
from boute.specs.plan import ReplicaGroup
from boute.specs.scenario import Scenario, with_affinity

GROUPS = (
    ReplicaGroup(tier="small", model="llama-3.1-8b", gpu="rtx-4090", count=2),
    ReplicaGroup(tier="large", model="llama-3.1-70b", gpu="h100-sxm", count=1, tp=4),
)


def _candidate() -> Candidate:
    return Candidate((1.0, 0.0), GROUPS, 10.0)  # all on one tier: a plan without a router to name


def test_a_candidate_plan_carries_the_balancing_it_is_judged_under() -> None:
    sc = load_scenario("builtin:paper-gsm8k")
    assert sc.balancing.affinity is None and candidate_plan(sc, _candidate()).affinity_in_force() is None
    on = with_affinity(sc, Affinity(min_match=0.5))
    plan = candidate_plan(on, _candidate())
    assert plan.affinity == Affinity(min_match=0.5) and plan.affinity_in_force() == plan.affinity
    off = candidate_plan(with_affinity(on, Affinity(enabled=False)), _candidate())
    assert off.affinity is not None and off.affinity_in_force() is None  # the figures kept, least load used
    assert with_affinity(sc, None) is sc


@pytest.mark.parametrize("affinity", [Affinity(), Affinity(enabled=False), None])
def test_the_request_sets_the_scenarios_balancing(tmp_path: Path, affinity: Affinity | None) -> None:
    sc = PlanRequest(out=tmp_path / "plan.json", scenario="builtin:shared-system-prompt", affinity=affinity)
    got = sc.load_scenario().balancing.affinity
    assert got == affinity  # None: the scenario's own (the built-in has none)


@pytest.mark.parametrize(
    ("section", "field"),
    [({"affinity": {"min_match": 2}}, "min_match"), ({"affinity": {"block_chars": 1}}, "block_chars"), ({"x": 1}, "x")],
)
def test_a_bad_balancing_section_names_its_field(section: dict[str, Any], field: str) -> None:
    data = load_scenario("builtin:paper-gsm8k").model_dump()
    with pytest.raises(SpecError, match=field) as err:
        validate(Scenario, {**data, "balancing": section}, "scenario.yaml")
    assert "balancing" in str(err.value)
