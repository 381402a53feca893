"""Tracking DB on SQLite and the real local PostgreSQL: migrations, transactional trials, resume, profile runs."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

from boute.errors import BouteError
from boute.optimize.session import SearchRuntime, optimize
from boute.optimize.settings import SearchSettings
from boute.specs import load_scenario
from boute.tracking import open_store
from boute.tracking.models import Base
from tests.optimize_synthetic import SyntheticEvaluator

PROFILE_TABLES = {"profile_runs", "profile_points"}


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
    assert {"experiments", "trials", "pareto_fronts", "plans", "alembic_version"} | PROFILE_TABLES <= names
    with s2.engine.connect() as c:
        assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0005"
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
    first = optimize(
        sc,
        SearchSettings(strategy="nsga2", max_evals=15, patience=None, experiment="r", batch=1, workers=1),
        SearchRuntime(evaluator=ev, store=store),
    )
    calls = ev.calls
    again = optimize(
        sc,
        SearchSettings(strategy="nsga2", max_evals=30, patience=None, experiment="r", batch=1, workers=1),
        SearchRuntime(evaluator=ev, store=store),
    )
    assert again.resumed_trials == len(first.trials) and first.evaluations == 15  # screened ones are stored too
    assert ev.calls - calls <= 15  # only the new trials were evaluated (cached duplicates cost nothing)
    rows = store.trial_rows(first.experiment_id)
    assert [r.index for r in rows] == list(range(len(again.trials))) and again.evaluations == 30
    # the stored run equals an uninterrupted one: no trial lost, none repeated
    fresh = optimize(
        sc,
        SearchSettings(strategy="nsga2", max_evals=30, patience=None, batch=1, workers=1),
        SearchRuntime(evaluator=SyntheticEvaluator(sc)),
    )
    assert [r.params["x"] for r in rows] == [list(t.x) for t in fresh.trials]
    assert store.experiment("r").status in ("complete", "infeasible")
    assert len(store.fronts(first.experiment_id)) == 2
    store.close()


def test_resume_with_other_settings_is_a_clear_error(sqlite_url: str) -> None:
    sc = load_scenario(None)
    store = open_store(sqlite_url)
    optimize(
        sc,
        SearchSettings(strategy="random", max_evals=3, experiment="x", batch=1, workers=1),
        SearchRuntime(evaluator=SyntheticEvaluator(sc), store=store),
    )
    with pytest.raises(BouteError, match="'x' was run with strategy='random'"):
        optimize(
            sc,
            SearchSettings(strategy="nsga2", max_evals=3, experiment="x", batch=1, workers=1),
            SearchRuntime(evaluator=SyntheticEvaluator(sc), store=store),
        )
    store.close()


def test_trials_of_another_perf_model_are_not_resumed(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A BOute upgrade that re-fits the perf model changes every evaluation while the scenario stays the
    same: the stored trials belong to the old model, so resuming them under the same name is a clear error,
    and an unnamed run starts a new experiment."""
    import dataclasses

    import boute.perf.structure as structure

    sc = load_scenario(None)
    store = open_store(sqlite_url)
    old = optimize(
        sc,
        SearchSettings(strategy="random", max_evals=3, batch=1, workers=1),
        SearchRuntime(evaluator=SyntheticEvaluator(sc), store=store),
    )
    optimize(
        sc,
        SearchSettings(strategy="random", max_evals=3, experiment="p", batch=1, workers=1),
        SearchRuntime(evaluator=SyntheticEvaluator(sc), store=store),
    )
    fit = structure.packaged_fit()
    refit = dataclasses.replace(fit, structure=dataclasses.replace(fit.structure, roofline_p=2.0))
    monkeypatch.setattr(structure, "packaged_fit", lambda: refit)  # the upgraded install's packaged fit
    with pytest.raises(BouteError, match="'p' was run with perf_sha="):
        optimize(
            sc,
            SearchSettings(strategy="random", max_evals=3, experiment="p", batch=1, workers=1),
            SearchRuntime(evaluator=SyntheticEvaluator(sc), store=store),
        )
    new = optimize(
        sc,
        SearchSettings(strategy="random", max_evals=3, batch=1, workers=1),
        SearchRuntime(evaluator=SyntheticEvaluator(sc), store=store),
    )
    assert new.experiment_id != old.experiment_id and new.resumed_trials == 0
    store.close()


def test_unreachable_database_is_one_line() -> None:
    with pytest.raises(BouteError, match="--db: cannot open tracking database"):
        open_store("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1")


def test_a_new_sqlite_database_gets_its_folder(tmp_path) -> None:
    """`--db sqlite:///runs/new/b.db` in a fresh checkout: the folder is made (it was 'unable to open
    database file'); a path through a file is still a one-line error."""
    store = open_store(f"sqlite:///{tmp_path / 'runs' / 'new' / 'b.db'}")
    store.close()
    assert (tmp_path / "runs" / "new" / "b.db").is_file()
    (tmp_path / "f").write_text("")
    with pytest.raises(BouteError, match="--db: cannot open tracking database"):
        open_store(f"sqlite:///{tmp_path / 'f' / 'b.db'}")


# ---- profiling runs (migration 0002) ----------------------------------------------------------------------


def _alembic_cfg():
    from alembic.config import Config

    import boute.tracking

    here = Path(boute.tracking.__file__).parent
    cfg = Config(str(here / "alembic.ini"))
    cfg.set_main_option("script_location", str(here / "migrations"))
    return cfg


def _to_revision(url: str, revision: str, *, down: bool = False) -> None:
    """Run the packaged migrations up (or down) to ``revision`` on ``url``, as an older BOute left it."""
    from alembic import command

    eng = create_engine(url)
    try:
        cfg = _alembic_cfg()
        with eng.begin() as conn:
            cfg.attributes["connection"] = conn
            (command.downgrade if down else command.upgrade)(cfg, revision)
    finally:
        eng.dispose()


def _run(gpu: str = "rtx-4090", **extra) -> dict:
    return {
        "kind": "perf",
        "endpoint": "http://127.0.0.1:30000/v1",
        "model": "llama-3.2-1b",
        "gpu": gpu,
        "tp": 1,
        "pp": 1,
        "dtype": "bf16",
        "settings": {"api": "chat", "concurrency": [1, 4], "inputs": [128], "outputs": [16], "requests": 4},
        "calibration": {
            "efficiency": {"compute": 0.41, "memory": 0.72},
            "fitted": ["compute", "memory"],
            "median_abs_error_pct_before": 61.2,
            "median_abs_error_pct_after": 3.4,
        },
        "calibration_path": "/tmp/cal.yaml",
        "status": "complete",
        **extra,
    }


def _point(concurrency: int, ttft: float, **extra) -> dict:
    return {
        "concurrency": concurrency,
        "rate_rps": None,
        "input_len": 128,
        "output_len": 16,
        "requests": 4,
        "completed": 4,
        "failed": 0,
        "input_tokens": 131.5,
        "output_tokens": 16.0,
        "ttft_ms_mean": ttft,
        "ttft_ms_p50": ttft,
        "ttft_ms_p95": ttft * 1.5,
        "tpot_ms_mean": 7.25,
        "tpot_ms_p50": 7.0,
        "e2e_ms_mean": ttft + 15 * 7.25,
        "throughput_rps": 2.5 * concurrency,
        "output_tokens_per_s": 40.0 * concurrency,
        "wall_s": 1.6,
        "errors": [],
        **extra,
    }


def test_profile_run_round_trip_stores_nan_as_null(db_url: str) -> None:
    store = open_store(db_url)
    try:
        nan = float("nan")
        failed = _point(8, nan, completed=0, failed=4, tpot_ms_mean=nan, tpot_ms_p50=nan, ttft_ms_p95=nan)
        failed.update(e2e_ms_mean=nan, input_tokens=nan, output_tokens=nan, errors=["HTTP 503: overloaded"])
        cal = {**_run()["calibration"], "median_abs_error_pct_before": nan, "per_point": [1.0, float("inf")]}
        run_id = store.add_profile_run(_run(calibration=cal, status="partial"), [_point(1, 42.5), failed])
        other = store.add_profile_run(_run(gpu="h100-sxm"), [_point(1, 12.0)])
        assert other != run_id

        runs = store.profile_runs()
        assert [r["id"] for r in runs] == [run_id, other] and [r["points"] for r in runs] == [2, 1]
        assert [r["id"] for r in store.profile_runs("h100-sxm")] == [other]
        assert store.profile_runs("a100-80g") == []
        run = store.profile_run(run_id)
        assert run is not None and run["status"] == "partial" and run["settings"]["concurrency"] == [1, 4]
        assert run["calibration"]["median_abs_error_pct_before"] is None
        assert run["calibration"]["per_point"] == [1.0, None]
        assert run["calibration"]["efficiency"] == {"compute": 0.41, "memory": 0.72}
        assert store.profile_run(10_000) is None and store.profile_points(10_000) == []

        ok, bad = store.profile_points(run_id)
        assert (ok["index"], bad["index"]) == (0, 1)
        assert ok == {"index": 0, **_point(1, 42.5)}  # every column comes back as written
        for key in ("ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p95", "tpot_ms_mean", "e2e_ms_mean", "input_tokens"):
            assert bad[key] is None, key  # NULL, not NaN
        assert bad["errors"] == ["HTTP 503: overloaded"] and bad["failed"] == 4
        with store.engine.connect() as c:  # and NULL in SQL too
            nulls = c.execute(
                text("SELECT COUNT(*) FROM profile_points WHERE ttft_ms_mean IS NULL AND tpot_ms_mean IS NULL")
            ).scalar()
        assert nulls == 1
        assert not any(isinstance(v, float) and math.isnan(v) for v in bad.values())
    finally:
        store.close()


def test_profile_run_is_written_in_one_transaction(db_url: str) -> None:
    store = open_store(db_url)
    try:
        # the second point repeats index 0: the unique (run_id, index) refuses it, and the run goes too
        with pytest.raises(IntegrityError):
            store.add_profile_run(_run(), [_point(1, 40.0), _point(2, 50.0, index=0)])
        with pytest.raises(ValueError, match="unknown fields"):
            store.add_profile_run(_run(), [_point(1, 40.0), _point(2, 50.0, ttft_typo=1.0)])
        assert store.profile_runs() == []
        with store.engine.connect() as c:
            assert c.execute(text("SELECT COUNT(*) FROM profile_points")).scalar() == 0
        # deleting a run deletes its points (ON DELETE CASCADE)
        run_id = store.add_profile_run(_run(), [_point(1, 40.0), _point(2, 50.0)])
        with store.engine.begin() as c:
            c.execute(text("DELETE FROM profile_runs WHERE id = :i"), {"i": run_id})
        with store.engine.connect() as c:
            assert c.execute(text("SELECT COUNT(*) FROM profile_points")).scalar() == 0
    finally:
        store.close()


def test_migration_upgrades_a_0001_database_in_place(db_url: str) -> None:
    _to_revision(db_url, "0001")  # a database written by a BOute without profile tables
    eng = create_engine(db_url)
    try:
        assert not PROFILE_TABLES & set(inspect(eng).get_table_names())
        with eng.begin() as c:
            c.execute(
                text(
                    "INSERT INTO experiments (name, scenario, strategy, evaluator, seed, settings, status, "
                    "created_at, updated_at) VALUES ('old', 'builtin', 'random', 'fast', 3, '{}', 'complete', "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
    finally:
        eng.dispose()
    store = open_store(db_url)  # migrates 0001 -> 0005
    try:
        names = set(inspect(store.engine).get_table_names())
        assert names >= PROFILE_TABLES
        indexes = {i["name"] for i in inspect(store.engine).get_indexes("profile_runs")}
        assert "ix_profile_runs_gpu" in indexes
        with store.engine.connect() as c:
            assert c.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0005"
        old = store.experiment("old")
        assert old is not None and (old.strategy, old.seed, old.status) == ("random", 3, "complete")
        run_id = store.add_profile_run(_run(), [_point(1, 40.0)])
        assert store.profile_points(run_id)[0]["ttft_ms_mean"] == 40.0
    finally:
        store.close()
    _to_revision(db_url, "0001", down=True)  # and the migration can be reverted
    eng = create_engine(db_url)
    try:
        assert not PROFILE_TABLES & set(inspect(eng).get_table_names())
        assert "experiments" in set(inspect(eng).get_table_names())
    finally:
        eng.dispose()


def test_migration_0003_names_the_axes_of_existing_fronts(db_url: str) -> None:
    """A front recorded before fronts named their axes is a (quality, P95) front; new 3-D fronts say so."""
    _to_revision(db_url, "0002")
    eng = create_engine(db_url)
    try:
        with eng.begin() as c:
            c.execute(
                text(
                    "INSERT INTO experiments (name, scenario, strategy, evaluator, seed, settings, status, "
                    "created_at, updated_at) VALUES ('old', 'builtin', 'mobo', 'fast', 0, '{}', 'complete', "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
            exp_id = c.execute(text("SELECT id FROM experiments WHERE name = 'old'")).scalar()
            c.execute(
                text(
                    "INSERT INTO pareto_fronts (experiment_id, evaluator, points, hypervolume, n_trials, created_at) "
                    "VALUES (:e, 'fast', '[]', 0.5, 10, CURRENT_TIMESTAMP)"
                ),
                {"e": exp_id},
            )
    finally:
        eng.dispose()
    store = open_store(db_url)  # migrates 0002 -> 0005
    try:
        (old,) = store.fronts(exp_id)
        assert old.axes == "quality,p95_latency_s" and old.hypervolume == 0.5
        pt = {"trial": 1, "quality": 0.7, "p95_latency_s": 3.0, "cost_per_hour": 12.5}
        store.add_front(exp_id, "fast", [pt], 0.1, 11, axes=("quality", "p95_latency_s", "cost_per_hour"))
        new = store.fronts(exp_id)[-1]
        assert new.axes == "quality,p95_latency_s,cost_per_hour" and new.points == [pt]
    finally:
        store.close()
    _to_revision(db_url, "0002", down=True)
    eng = create_engine(db_url)
    try:
        assert "axes" not in {c["name"] for c in inspect(eng).get_columns("pareto_fronts")}
    finally:
        eng.dispose()


def test_models_match_the_migrated_schema(db_url: str) -> None:
    """models.py and the migrations describe the same schema (no autogenerate diff on the profile tables)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    store = open_store(db_url)
    try:
        with store.engine.connect() as c:
            diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    finally:
        store.close()
    assert diff == [], diff


def test_a_sqlite_store_writes_ahead_and_a_trial_committed_in_one_process_is_read_in_another(
    sqlite_url: str, tmp_path: Path
) -> None:
    """WAL with synchronous=NORMAL (store.py says why): each commit is in the log before it returns, so
    another process (``boute experiments``, a resumed search) reads it at once."""
    import sqlite3
    import subprocess
    import sys

    store = open_store(sqlite_url)
    try:
        with store.engine.connect() as c:
            assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert c.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
        exp, _ = store.open_experiment("w", scenario="s", strategy="random", evaluator="x", seed=0, settings={})
        row = {"index": 0, "status": "complete", "evaluator": "x", "params": {"x": [0.5]}, "metrics": {}, "wall_s": 0.0}
        store.add_trial(exp.id, row)
        db = tmp_path / "track.db"
        code = (
            f"import sqlite3; print(sqlite3.connect({str(db)!r}).execute('SELECT count(*) FROM trials').fetchone()[0])"
        )
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert got.stdout.strip() == "1"  # committed, and visible to another process while this one holds it open
        assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # kept in the file
    finally:
        store.close()
