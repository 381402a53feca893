"""The router registry: one kind per plan scorer, and the ladder's one name in the code with its old spelling on
disk."""

from __future__ import annotations

import json
from typing import get_args

import pytest

from boute.errors import SpecError
from boute.quality.router_kinds import ROUTER_KINDS, TRAINED_KINDS, RouterKind, register, trained_kind
from boute.specs.io import validate
from boute.specs.plan import Plan, Routing
from boute.specs.scenario import QualitySource
from boute.specs.scorers import SCORER_RULES
from tests.stack import TEST_PLAN

LADDER = {"tiers": ["small", "large"], "fractions": [0.5, 0.5], "router": "r.npz", "reference": "builtin:gsm8k"}


def test_every_plan_scorer_has_its_kind_and_the_scenario_trains_the_trained_ones() -> None:
    assert set(ROUTER_KINDS) == set(SCORER_RULES)
    assert all(kind.rule.name == name for name, kind in ROUTER_KINDS.items())
    assert get_args(QualitySource.model_fields["router_kind"].annotation) == TRAINED_KINDS


def test_a_kind_without_a_row_in_the_plan_table_is_refused() -> None:
    class Unknown(RouterKind):
        name = "unknown"

    with pytest.raises(ValueError, match="no row"):
        register(Unknown)
    assert "unknown" not in ROUTER_KINDS


@pytest.mark.parametrize("spelling", ["learned", "ladder"])
def test_the_ladder_reads_either_spelling_and_is_written_as_old_gateways_read_it(spelling: str) -> None:
    r = Routing.model_validate({**LADDER, "scorer": spelling})
    assert r.scorer == "ladder"
    assert r.model_dump()["scorer"] == "learned"
    assert json.loads(r.model_dump_json())["scorer"] == "learned"
    assert Routing.model_validate_json(r.model_dump_json()) == r


def test_an_unknown_scorer_is_refused_as_before() -> None:
    doc = {**TEST_PLAN, "routing": {**TEST_PLAN["routing"], "scorer": "nope"}}
    with pytest.raises(SpecError, match=r"routing\.scorer: Input should be 'learned', 'length' or 'multi'$"):
        validate(Plan, doc, "plan.json")


def test_the_scorer_rules_keep_the_validators_messages() -> None:
    with pytest.raises(ValueError, match="routing.scorer 'learned' needs routing.router"):
        Routing.model_validate({**LADDER, "router": None, "scorer": "ladder"})
    with pytest.raises(ValueError, match="routing.scorer 'multi' routes by routing.prices, not thresholds"):
        Routing.model_validate({**LADDER, "scorer": "multi", "thresholds": [0.5]})
    with pytest.raises(ValueError, match="read with mode 'preroute' and scorer 'multi' only"):
        Routing.model_validate({**LADDER, "scorer": "length", "prices": [0.0, 0.1]})


def test_a_scorer_the_optimiser_does_not_train_is_no_scenario_router_kind() -> None:
    with pytest.raises(SpecError, match="quality.router_kind: must be one of ladder, multi, got 'length'"):
        trained_kind("length")
