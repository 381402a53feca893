"""Serving evaluators: the discrete-event simulator (reference) and the analytical fast path (inner loop)."""

from boute.sim.engine import JUDGE_DELAY_S, plan_cost, simulate
from boute.sim.fastpath import FastResult, fast_evaluate
from boute.sim.result import SimResult

__all__ = ["JUDGE_DELAY_S", "FastResult", "SimResult", "fast_evaluate", "plan_cost", "simulate"]
