"""The report's edge: what ``boute report``, ``boute optimize --report`` and ``boute verify`` call.

:func:`write_report` opens the tracking DB, gathers the experiment, renders it and writes the page atomically.
:func:`record_verification` files a ``boute verify`` verdict in the tracking DB against the plan it checked,
where the report of that plan's experiment finds it: in the DB rather than beside the plan file because the
DB is where a report is made from (``boute report`` later, on any machine holding the DB), because it
keeps every verification's history, and because a plan file is a deployment's input that verifying should
not rewrite. A plan is found by its creation time and deployment (:meth:`Store.plan_row_of`); verify never
creates a tracking DB: with none at the URL, nothing is recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from boute.tracking.store import Store, normalise_url, open_store


def existing_store(db: str | None) -> Store | None:
    """The tracking DB at ``db`` (None: the default), opened, or None when it is a SQLite file that does not
    exist (opening it would create an empty one)."""
    from sqlalchemy.engine import make_url

    url = normalise_url(db)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        name = parsed.database
        if name and name != ":memory:" and not name.startswith("file:") and not Path(name).is_file():
            return None
    return open_store(url)


def write_report(db: str | None, ref: str | int | None, out: Path) -> Path:
    """Write the report of experiment ``ref`` (None: the newest) of the tracking DB ``db`` to ``out``."""
    from boute.report.gather import gather
    from boute.report.render import render
    from boute.specs.io import write_atomic

    store = open_store(db)
    try:
        report = gather(store, ref)
    finally:
        store.close()
    return write_atomic(out, render(report))


def record_verification(
    store: Store, plan_doc: Mapping[str, Any], verdict: Mapping[str, Any], info: Mapping[str, Any], plan_path: str
) -> int | None:
    """Record the verdict against the recorded plan ``plan_doc`` is; the plan's experiment id, or None when
    the DB does not hold that plan (nothing recorded)."""
    row = store.plan_row_of(dict(plan_doc))
    if row is None:
        return None
    store.add_verification(row, dict(verdict), dict(info), plan_path)
    return int(row.experiment_id)
