"""Search strategies: what proposes the next plans from the trials so far (:class:`.base.Strategy`).

* :mod:`.mobo`: ``mobo``, the default: exact quality and cost, one GP on latency, acquisition over a pool.
* :mod:`.mobo_gp`: ``mobo-gp``, GPs for quality and latency (for a sampled quality: ``live``).
* :mod:`.random`: ``random``, uniform points; :mod:`.nsga2`: ``nsga2``; :mod:`.tpe`: ``tpe`` (Optuna).
* :mod:`.design`: the Sobol initial design the model-based ones start from.
* :mod:`.fixed`: the paper's fixed comparison plans (not searches).

Strategies are built by name through :func:`.factory.make_strategy`; the registry imports
each on first use, so this package's modules are not imported here.
"""

from boute.optimize.strategies.base import Strategy

__all__ = ["Strategy"]
