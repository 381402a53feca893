"""User-facing errors.

Every mistake a user can make (a bad scenario file, an unknown GPU, an infeasible target) is raised as a
:class:`BouteError`; the CLI prints its one-line message and exits 2 instead of showing a traceback.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError


class BouteError(Exception):
    """An error caused by user input; its message is one line meant for the user."""

    exit_code = 2


class SpecError(BouteError):
    """A specification file (scenario, plan, catalog, profile) is invalid.

    Carries the file, the field (dotted path, or ``line N`` for line-oriented files) and the reason, so the
    message can name all three.
    """

    def __init__(self, file: str | Path | None, field: str | None, reason: str) -> None:
        self.file = str(file) if file is not None else None
        self.field = field
        self.reason = reason
        parts = [p for p in (self.file, self.field) if p]
        super().__init__(": ".join([*parts, reason]))

    def __reduce__(self) -> tuple[type[SpecError], tuple[str | None, str | None, str]]:
        # crosses process boundaries (a search in a worker process): rebuilt from its parts, not its message
        return (type(self), (self.file, self.field, self.reason))


class InfeasibleError(BouteError):
    """A request that cannot be satisfied (no plan meets the targets, a model does not fit)."""


class UnconfirmedError(InfeasibleError):
    """The search found plans meeting the targets, but the more faithful confirming evaluator rejected every
    one it checked: no plan is written (the message names the closest confirmed one and what to change)."""


class WorkerError(BouteError):
    """A worker process running a search died (killed, out of memory) before it answered: the request may
    be fine, the run is not."""


def field_path(loc: tuple[int | str, ...], prefix: str = "") -> str:
    """``("cluster", "gpus", 0, "name")`` -> ``cluster.gpus[0].name``."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(root)"


def from_validation_error(exc: ValidationError, file: str | Path | None, prefix: str = "") -> SpecError:
    """The first validation error, as a one-line SpecError; the count of others is appended."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    reason = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        reason = "unknown field"
    field = field_path(loc, prefix)
    if not loc:  # a model-level validator names the field itself as "a.b: reason"
        head, sep, tail = reason.partition(": ")
        if sep and " " not in head:
            field, reason = (f"{prefix}.{head}" if prefix else head), tail
    if len(errors) > 1:
        reason += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return SpecError(file, field, reason)
