"""What a search asks of the tracking store: the :class:`TrialStore` protocol and the rows it reads back.

:class:`boute.tracking.store.Store` (:func:`boute.tracking.open_store`) is the implementation; the optimiser
states only the calls it makes, so a search, a confirmation or a warm start can be handed any store that
answers them (a test's, or one over another database).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class StoredExperiment(Protocol):
    """An experiment as the store reads it back."""

    @property
    def id(self) -> int: ...

    @property
    def settings(self) -> Mapping[str, Any]: ...


class StoredTrial(Protocol):
    """A trial row as the store reads it back (:func:`boute.optimize.records.trial_from_row`)."""

    @property
    def index(self) -> int: ...

    @property
    def status(self) -> str: ...

    @property
    def params(self) -> Mapping[str, Any]: ...

    @property
    def metrics(self) -> Mapping[str, Any] | None: ...

    @property
    def error(self) -> str | None: ...

    @property
    def elapsed_s(self) -> float | None: ...


class TrialStore(Protocol):
    """The tracking store's calls the optimiser makes: experiments opened or resumed, trials, fronts and plans
    recorded as they come, the experiment's status and run records (``max_evals``, ``phase_s``, ...)."""

    def experiment(self, ref: str | int) -> StoredExperiment | None: ...

    def open_experiment(
        self, name: str, *, scenario: str, strategy: str, evaluator: str, seed: int, settings: dict[str, Any]
    ) -> tuple[StoredExperiment, bool]: ...

    def set_status(self, experiment_id: int, status: str, **settings: Any) -> None: ...

    def add_trial(self, experiment_id: int, row: dict[str, Any]) -> None: ...

    def trial_rows(self, experiment_id: int) -> Sequence[StoredTrial]: ...

    def add_front(
        self,
        experiment_id: int,
        evaluator: str,
        points: list[dict[str, Any]],
        hypervolume: float,
        n_trials: int,
        axes: tuple[str, ...] = ...,
    ) -> None: ...

    def add_plan(
        self,
        experiment_id: int,
        trial_index: int | None,
        plan: dict[str, Any],
        predicted: dict[str, Any] | None,
        confirmed: dict[str, Any] | None,
        path: str | None,
    ) -> None: ...

    def close(self) -> None: ...
