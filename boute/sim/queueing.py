"""Closed-form queue formulas the fast path (:mod:`boute.sim.fastpath`) applies to a tier of replicas.

Kept apart from the fast path's bookkeeping because they are textbook results with their own tests: the
Erlang-C wait probability for the many KV-batch slots of a tier, and how much least-outstanding balancing
over ``c`` replicas shortens a prefill-stage wait (M/M/c over M/M/1).
"""

from __future__ import annotations

import math


def pooling(c: int, rho: float) -> float:
    """Mean wait of an M/M/c queue over that of c separate M/M/1 queues at the same utilisation:
    ``C(c, rho) / (c rho)`` (Erlang C), 1 for one server. How much joining the least-loaded of ``c``
    replicas shortens the prefill-stage wait; exact for small ``c``, where the Halfin-Whitt form is not."""
    if c <= 1 or rho <= 0:
        return 1.0
    rho = min(rho, 0.999)
    a = c * rho
    term = total = 1.0
    for k in range(1, c):
        term *= a / k
        total += term
    last = term * a / c / (1.0 - rho)
    return (last / (total + last)) / (c * rho)


def erlang_c(c: float, rho: float) -> float:
    """P(wait) in an M/M/c queue, Halfin-Whitt approximation (good for the large c of batch slots)."""
    beta = (1.0 - rho) * math.sqrt(c)
    if beta <= 0:
        return 1.0
    if beta > 30.0:
        return 0.0
    phi = math.exp(-0.5 * beta * beta) / math.sqrt(2 * math.pi)
    big_phi = 0.5 * (1.0 + math.erf(beta / math.sqrt(2.0)))
    return min(1.0, 1.0 / (1.0 + beta * big_phi / phi))
