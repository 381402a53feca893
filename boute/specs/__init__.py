"""Specs: the scenario a user describes and the plan BOute produces (pydantic, YAML/JSON files)."""

from boute.specs.plan import Plan, Prediction, ReplicaGroup, Routing, load_plan, save_plan
from boute.specs.scenario import Scenario, load_scenario
from boute.specs.targets import Targets

__all__ = [
    "Plan",
    "Prediction",
    "ReplicaGroup",
    "Routing",
    "Scenario",
    "Targets",
    "load_plan",
    "load_scenario",
    "save_plan",
]
