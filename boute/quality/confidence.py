"""A one-sided lower confidence bound on a routing policy's quality, from its held-out queries.

A policy sends held-out query ``i`` to one tier; ``y_i`` in [0, 1] is that tier's recorded score on it (for
a cascade, the score of the tier whose answer is kept). The promised quality is the mean
``ybar = (1/n) sum y_i``; the quality the policy will have on the traffic the held-out queries were drawn
from is the unknown ``mu = E[y]``. The bound at level ``c`` (default 0.95) is

    L = ybar - t_{c, n-1} * s / sqrt(n),    s^2 = (sum y_i^2 - n ybar^2) / (n - 1),

with ``t_{c, n-1}`` the ``c`` quantile of Student's t with n-1 degrees of freedom (1.650 for n = 306 at
0.95; the normal's 1.645 as n grows). By the central limit theorem ``P(mu >= L) -> c`` for i.i.d. draws,
so a plan whose ``L`` meets the floor has quality at or above the floor with about that confidence.
The sums are kept as running totals, so the bound costs two subtractions per evaluation, as the mean does.

What it does not cover: (1) a plan *chosen* because its held-out quality looks high (the optimiser tries
thousands) carries some winner's curse that a pointwise bound does not correct; (2) for a mean near 0 or 1
on few queries the normal approximation is poor (a 0/1 score with ybar = 1 gives s = 0, L = 1); (3) a
re-weighted traffic mix (``workload.mix``) resamples held-out queries with repeats, and the bound still
counts n, so it is somewhat optimistic there. Coverage on the RouterBench scenarios is measured by
resampling (tests/test_quality_confidence.py, bench/bench_quality_routers.py): the true quality falls
below L in about 1 - c of the draws.
"""

from __future__ import annotations

import math
from functools import lru_cache

DEFAULT_LEVEL = 0.95


@lru_cache(maxsize=64)
def t_quantile(level: float, n: int) -> float:
    """The ``level`` quantile of Student's t with ``n - 1`` degrees of freedom (normal for n > 10**6).

    From ``scipy.special`` (``stdtrit``, ``ndtri``: the functions ``scipy.stats.t.ppf`` and ``norm.ppf``
    evaluate, equal to the last bit for levels 0.5-0.9999 and n 1-10**7), not ``scipy.stats``: importing
    that costs 0.5 s of CPU in every process that builds a quality model, and a search's pool workers (one
    per core, each building its own) import it for nothing else."""
    from scipy.special import ndtri, stdtrit

    if not 0.5 <= level < 1:
        raise ValueError(f"confidence level must be in [0.5, 1), got {level}")
    return float(ndtri(level) if n > 10**6 else stdtrit(max(n - 1, 1), level))


def mean_and_se(total: float, total_sq: float, n: int) -> tuple[float, float]:
    """Mean and standard error of the mean from ``sum y`` and ``sum y^2`` over ``n`` values."""
    if n <= 0:
        return 0.0, 0.0
    mean = total / n
    if n < 2:
        return mean, 0.0
    var = max(total_sq - n * mean * mean, 0.0) / (n - 1)
    return mean, math.sqrt(var / n)


def lower_bound(mean: float, se: float, n: int, level: float = DEFAULT_LEVEL) -> float:
    """``mean - t_{level, n-1} * se``: the one definition of the bound (module doc)."""
    return mean - t_quantile(level, n) * se
