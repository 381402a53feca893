"""Latency quantiles: one definition for every P95 BOute reports or compares.

The simulator predicts a plan's P95, ``boute verify`` measures it through the gateway, the re-plan
window judges it against the promise, and the live evaluator confirms it: all four compare figures
with each other, so they must compute the same statistic from the same samples.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def quantile(values: ArrayLike, q: float) -> float:
    """The ``q`` quantile of ``values`` (NaN when empty) by the inverted empirical CDF.

    Why ``inverted_cdf`` (the smallest value with at least ``q`` of the samples at or below it) rather
    than numpy's default linear interpolation:

    - it is a latency that was observed, and ``quantile(x, 0.95) <= cap`` holds exactly when at least 95%
      of the requests finished within ``cap``: the SLO's own statement;
    - the simulator counts unfinished requests as infinitely slow (``inf``); interpolating between the
      slowest finished request and ``inf`` gives ``inf`` (or NaN) for a quantile that is finite;
    - linear interpolation would shift a measured P95 against the simulated one on identical samples
      (by up to one gap between neighbouring samples, large in the tail of a few hundred requests).
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan")
    return float(np.quantile(x, q, method="inverted_cdf"))
