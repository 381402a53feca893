"""Tracking DB on SQLite and the real local PostgreSQL: migrations, transactional trials, resume."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

from boute.errors import BouteError
from boute.optimize.session import optimize
from boute.specs import load_scenario
from boute.tracking import open_store
from tests.optimize_synthetic import SyntheticEvaluator


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'track.db'}"


@pytest.fixture
def pg_schema_url(pg_url: str) -> Iterator[str]:
    """A fresh schema per test on the shared server (dropped afterwards): no clash with other tests."""
    schema = f"boute_t_{uuid.uuid4().hex[:10]}"
    eng = create_engine(pg_url)
    with eng.begin() as c:
        c.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in pg_url else "?"
    try:
        yield f"{pg_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with eng.begin() as c:
            c.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        eng.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_schema_url")


def test_migrations_create_the_schema_and_are_idempotent(db_url: str) -> None:
    s1 = open_store(db_url)
    s1.close()
    s2 = open_store(db_url)  # second open: upgrade to head is a no-op
    names = set(inspect(s2.engine).get_table_names())
    assert {"experiments", "trials", "pareto_fronts", "plans", "alembic_version"} <= names
    with s2.engine.connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0001"
    s2.close()


def test_duplicate_trial_index_is_refused_and_rolled_back(db_url: str) -> None:
    store = open_store(db_url)
    exp, resumed = store.open_experiment("dup", scenario="s", strategy="random", evaluator="x", seed=0, settings={})
    assert not resumed
    row = {
        "index": 0,
        "status": "complete",
        "evaluator": "x",
        "params": {"x": [0.5]},
        "metrics": {"quality": 1.0},
        "wall_s": 0.01,
    }
    store.add_trial(exp.id, row)
    with pytest.raises(IntegrityError):
        store.add_trial(exp.id, row)
    assert [r.index for r in store.trial_rows(exp.id)] == [0]
    store.close()


def test_resume_continues_from_stored_trials(db_url: str) -> None:
    sc = load_scenario(None)
    ev = SyntheticEvaluator(sc)
    store = open_store(db_url)
    first = optimize(sc, strategy="nsga2", evaluator=ev, max_evals=15, patience=None, store=store, experiment="r")
    calls = ev.calls
    again = optimize(sc, strategy="nsga2", evaluator=ev, max_evals=30, patience=None, store=store, experiment="r")
    assert again.resumed_trials == 15
    assert ev.calls - calls <= 15  # only the new trials were evaluated (cached duplicates cost nothing)
    rows = store.trial_rows(first.experiment_id)
    assert [r.index for r in rows] == list(range(30))
    # the stored run equals an uninterrupted one: no trial lost, none repeated
    fresh = optimize(sc, strategy="nsga2", evaluator=SyntheticEvaluator(sc), max_evals=30, patience=None)
    assert [r.params["x"] for r in rows] == [list(t.x) for t in fresh.trials]
    assert store.experiment("r").status in ("complete", "infeasible")
    assert len(store.fronts(first.experiment_id)) == 2
    store.close()


def test_resume_with_other_settings_is_a_clear_error(sqlite_url: str) -> None:
    sc = load_scenario(None)
    store = open_store(sqlite_url)
    optimize(sc, strategy="random", evaluator=SyntheticEvaluator(sc), max_evals=3, store=store, experiment="x")
    with pytest.raises(BouteError, match="'x' was run with strategy='random'"):
        optimize(sc, strategy="nsga2", evaluator=SyntheticEvaluator(sc), max_evals=3, store=store, experiment="x")
    store.close()


def test_unreachable_database_is_one_line() -> None:
    with pytest.raises(BouteError, match="--db: cannot open tracking database"):
        open_store("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1")
