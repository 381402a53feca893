"""Acquisition for strategy ``mobo``: which new plans to score, and how.

* :mod:`.pool`: the candidates, a pool of canonical, distinct, unevaluated plans (local moves around the
  incumbents, every one-coordinate neighbour of the best, a global uniform sample), screened.
* :mod:`.functions`: the scores, BoTorch's log acquisitions (LogEI, constrained qLogEI on cost, qLogNEHVI)
  on the strategy's models, one log-score per pool plan.
"""

from boute.optimize.acquisition.functions import log_cei_cost, log_ei, log_nehvi
from boute.optimize.acquisition.pool import Pool, axis_neighbours, build_pool

__all__ = ["Pool", "axis_neighbours", "build_pool", "log_cei_cost", "log_ei", "log_nehvi"]
