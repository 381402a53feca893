"""Evaluations in parallel on a Ray cluster: :class:`EvaluatorPool`'s contract with Ray actors as its workers.

Why: on one machine a search gets as many parallel simulations as it has cores; a user with a Ray cluster
(the one ``boute deploy --target ray`` runs on, or any other) can spread a batch over its nodes instead.
Each actor builds its evaluator once from the pool's :class:`~boute.optimize.evaluators.pool.EvaluatorSpec`,
as a pool process does, so a batch costs only the candidates' transfer; results come back in
the order asked (:class:`ray.util.ActorPool`'s ordered ``map``, which hands each candidate to the next free
actor), so the trials, and resuming, do not depend on which node finished first: a search on Ray records
the trials a local one would. Every node needs BOute installed (the same version) to import the evaluator.

One actor per CPU of the cluster, or ``workers`` of them, never more than the cluster has CPUs (an actor
that cannot be placed would wait for ever). ``--batch`` says how many evaluations run at once: raise it
with the cluster's size. Evaluators that own external state (``live``) are evaluated in this process.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from boute.errors import BouteError, WorkerError
from boute.optimize.evaluators.base import EvalResult, Evaluator
from boute.optimize.evaluators.pool import POOLABLE, EvaluatorPool, EvaluatorSpec, Submitted, attempt
from boute.optimize.space import Candidate
from boute.specs import Scenario

#: seconds to wait for a cluster's port to accept a connection before saying that nothing answers there
CONNECT_TIMEOUT_S = 5.0


def check_reachable(address: str) -> None:
    """A one-line BouteError when ``HOST:PORT`` (or ``ray://HOST:PORT``) accepts no connection.

    Why before ``ray.init``: Ray retries a GCS address that does not answer for minutes before it fails, so a
    mistyped address would look like a hung search. ``auto`` and ``local`` are left to Ray, which answers
    them at once."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise BouteError(f"--ray-address: no Ray cluster answers at {address!r} ({exc})") from None


class EvaluatorActor:
    """One worker: the search's evaluator, rebuilt once on its node (made a Ray actor by the pool)."""

    def __init__(self, spec: EvaluatorSpec) -> None:
        os.environ["OMP_NUM_THREADS"] = "1"  # one core per actor, as each pool process (pool.py says why)
        self.evaluator = spec.build()

    def evaluate(self, cand: Candidate) -> EvalResult | BouteError:
        return attempt(self.evaluator, cand)


class _OnActors(Submitted):
    """A batch out with the pool's actors (:meth:`RayEvaluatorPool.submit`)."""

    def __init__(self, refs: list[Any], pool: RayEvaluatorPool) -> None:
        super().__init__()
        self._refs, self._pool = refs, pool

    def results(self) -> list[EvalResult | BouteError]:
        import ray

        try:
            out: list[EvalResult | BouteError] = ray.get(self._refs)
        except ray.exceptions.RayError as exc:  # an actor or its node died, or its evaluator failed to build
            self._pool.close()
            raise WorkerError(f"a Ray evaluator actor failed ({type(exc).__name__}: {exc})") from exc
        self.ready_at = time.monotonic()  # (when this call saw them: Ray does not say when the last one ended)
        return out


class RayEvaluatorPool(EvaluatorPool):
    """``map(candidates)`` on actors of the Ray cluster at ``address`` (module doc). A process already
    connected to a cluster (its own ``ray.init``) uses that one whatever ``address`` says; ``address`` None
    in a process not connected yet starts a local cluster, as ``ray.init()`` does."""

    def __init__(
        self, evaluator: Evaluator, scenario: Scenario, seed: int, *, address: str | None, workers: int | None = None
    ) -> None:
        super().__init__(evaluator, scenario, seed, workers=1)  # self.workers: the actors, counted at start()
        self.requested = workers
        self.address = address
        self._handles: list[Any] = []
        self._actors: Any = None  # a ray.util.ActorPool over the handles
        self._connected_here = False

    def start(self) -> list[Any]:
        """Connect (when not connected yet) and create the actors, without waiting for them to be built."""
        if self.evaluator.name not in POOLABLE or self._actors is not None:
            return []
        import ray
        from ray.util import ActorPool

        if not ray.is_initialized():
            if self.address is not None:
                check_reachable(self.address)
            try:
                ray.init(address=self.address, namespace="boute", log_to_driver=False)
            except Exception as exc:  # ConnectionError, ValueError, RuntimeError: Ray's reasons vary by version
                raise BouteError(f"--ray-address: no Ray cluster answers at {self.address!r} ({exc})") from None
            self._connected_here = True
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.workers = min(cpus, self.requested) if self.requested is not None else cpus
        actor = ray.remote(num_cpus=1)(EvaluatorActor)
        spec = EvaluatorSpec.of(self.evaluator, self._scenario, self._seed)
        self._handles = [actor.remote(spec) for _ in range(self.workers)]
        self._actors = ActorPool(self._handles)
        return []

    def map(self, cands: Sequence[Candidate]) -> list[EvalResult | BouteError]:
        if self.evaluator.name not in POOLABLE or len(cands) <= 1:
            return super().map(cands)  # in this process, as the local pool does
        import ray

        self.start()
        try:
            return list(self._actors.map(lambda a, c: a.evaluate.remote(c), list(cands)))
        except ray.exceptions.RayError as exc:  # an actor or its node died, or its evaluator failed to build
            self.close()
            raise WorkerError(f"a Ray evaluator actor failed ({type(exc).__name__}: {exc})") from exc

    def submit(self, cands: Sequence[Candidate]) -> Submitted:
        """Hand ``cands`` to the actors, round robin, and return at once (:meth:`Submitted.results` waits, in
        the order asked): the search proposes its next batch meanwhile."""
        if self.evaluator.name not in POOLABLE or not cands:
            return super().submit(cands)  # in this process, as the local pool does
        self.start()
        refs = [self._handles[i % len(self._handles)].evaluate.remote(c) for i, c in enumerate(cands)]
        return _OnActors(refs, self)

    def close(self) -> None:
        """Kill the actors, and disconnect when this pool connected (idempotent)."""
        if self._handles:
            import ray

            for a in self._handles:
                ray.kill(a)
        self._handles, self._actors = [], None
        if self._connected_here:
            import ray

            ray.shutdown()
            self._connected_here = False
