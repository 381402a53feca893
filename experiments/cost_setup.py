"""What experiment 5 compares: its scenarios, the systems beside BOute, the nominal budget and the paper's
claim. Shared by the search (:mod:`experiments.cost`) and the report (:mod:`experiments.cost_report`)."""

from __future__ import annotations

NAME = "cost"
SCENARIOS = ("gsm8k-f87", "gsm8k-f91", "mtbench-f81", "mtbench-f83", "mtbench-f85")
BASELINES = ("70b-homogeneous", "70b-heterogeneous", "routellm-equal", "boute-1gpu", "cascadia")
NOMINAL_BUDGET = 30.0
SHORT = {
    "70b-homogeneous": "70B\n1 type",
    "70b-heterogeneous": "70B\nmixed",
    "routellm-equal": "RouteLLM",
    "boute-1gpu": "BOute\n1 type",
    "cascadia": "Cascadia",
}
PAPER = {"saving_mean": 0.38, "saving_range": (0.15, 0.61)}
