"""The tracking store: open (and migrate) a database, record trials transactionally, read them back.

SQLite file by default (``sqlite:///boute.db``), PostgreSQL via ``postgresql+psycopg://...``. Migrations
ship in the package and run on open, so a database created by an older BOute is upgraded in place.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from boute.errors import BouteError
from boute.tracking.models import (
    Experiment,
    ParetoFront,
    PlanRow,
    ProfilePoint,
    ProfileRun,
    ReplanRow,
    TrialRow,
    VerificationRow,
)

DEFAULT_URL = "sqlite:///boute.db"
#: settings keys a run records about itself (not what it was asked to do): a resume need not match them
RUN_RECORDS = frozenset({"max_evals", "phase_s", "wall_s", "beside_s", "first_feasible", "screen_counts", "warm_start"})

_POINT_COLUMNS = tuple(c.key for c in ProfilePoint.__table__.columns if c.key not in ("id", "run_id"))
_RUN_COLUMNS = tuple(c.key for c in ProfileRun.__table__.columns if c.key != "id")


def finite(value: Any) -> Any:
    """``value`` with every NaN/infinity (also inside dicts, lists, tuples) replaced by ``None``.

    PostgreSQL's JSON refuses NaN, a float column would keep it and JSON readers choke on it: an unmeasured
    figure is stored as NULL.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    if type(value).__module__ == "numpy" and hasattr(value, "item"):  # numpy scalars (np.float64 is a float)
        return finite(value.item())
    return value


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat(timespec="seconds") if ts else None


def normalise_url(url: str | None) -> str:
    """``None`` -> the default SQLite file; a bare path -> a SQLite URL."""
    if not url:
        return DEFAULT_URL
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser()}"
    return url


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (idempotent)."""
    from alembic import command
    from alembic.config import Config

    here = Path(__file__).parent
    cfg = Config(str(here / "alembic.ini"))
    cfg.set_main_option("script_location", str(here / "migrations"))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._session = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def tx(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        with self._session() as s, s.begin():
            yield s

    # ---- experiments ----------------------------------------------------------------------------
    def experiment(self, ref: str | int) -> Experiment | None:
        with self.tx() as s:
            if isinstance(ref, int) or str(ref).isdigit():
                exp = s.get(Experiment, int(ref))
                if exp is not None:
                    return exp
            return s.scalar(select(Experiment).where(Experiment.name == str(ref)))

    def open_experiment(
        self, name: str, *, scenario: str, strategy: str, evaluator: str, seed: int, settings: dict[str, Any]
    ) -> tuple[Experiment, bool]:
        """The experiment called ``name`` (resumed: True) or a new one; settings must match to resume."""
        found = self.experiment(name)
        if found is not None:
            old = {"strategy": found.strategy, "evaluator": found.evaluator, "seed": found.seed, **found.settings}
            new = {"strategy": strategy, "evaluator": evaluator, "seed": seed, **settings}
            for key in sorted(set(old) | set(new)):
                if key not in RUN_RECORDS and old.get(key) != new.get(key):
                    raise BouteError(
                        f"--experiment: '{name}' was run with {key}={old.get(key)!r}, not {new.get(key)!r}; "
                        "pick another --experiment name to start a new one"
                    )
            return found, True
        with self.tx() as s:
            exp = Experiment(
                name=name,
                scenario=scenario,
                strategy=strategy,
                evaluator=evaluator,
                seed=seed,
                settings=settings,
                status="running",
            )
            s.add(exp)
            s.flush()
        return exp, False

    def set_status(self, experiment_id: int, status: str, **settings: Any) -> None:
        with self.tx() as s:
            exp = s.get(Experiment, experiment_id)
            if exp is None:
                return
            exp.status = status
            if settings:
                exp.settings = {**exp.settings, **settings}
            exp.updated_at = datetime.now(UTC)

    def experiments(self) -> list[dict[str, Any]]:
        from sqlalchemy import func

        with self.tx() as s:
            counts = dict(
                s.execute(select(TrialRow.experiment_id, func.count()).group_by(TrialRow.experiment_id)).all()
            )
            rows = s.scalars(select(Experiment).order_by(Experiment.id)).all()
            return [
                {
                    "id": e.id,
                    "name": e.name,
                    "scenario": e.scenario,
                    "strategy": e.strategy,
                    "evaluator": e.evaluator,
                    "seed": e.seed,
                    "status": e.status,
                    "trials": counts.get(e.id, 0),
                    "created_at": e.created_at.isoformat(timespec="seconds") if e.created_at else None,
                }
                for e in rows
            ]

    # ---- trials ---------------------------------------------------------------------------------
    def add_trial(self, experiment_id: int, row: dict[str, Any]) -> None:
        """Record one finished trial in its own transaction (the unique index refuses a duplicate)."""
        with self.tx() as s:
            s.add(TrialRow(experiment_id=experiment_id, **row))

    def trial_rows(self, experiment_id: int) -> list[TrialRow]:
        with self.tx() as s:
            return list(
                s.scalars(select(TrialRow).where(TrialRow.experiment_id == experiment_id).order_by(TrialRow.index))
            )

    # ---- results --------------------------------------------------------------------------------
    def add_front(
        self,
        experiment_id: int,
        evaluator: str,
        points: list[dict[str, Any]],
        hypervolume: float,
        n_trials: int,
        axes: tuple[str, ...] = ("quality", "p95_latency_s"),
    ) -> None:
        """Record a Pareto front over ``axes`` (EvalResult fields: 2-D for latency, 3-D for cost/pareto)."""
        with self.tx() as s:
            s.add(
                ParetoFront(
                    experiment_id=experiment_id,
                    evaluator=evaluator,
                    points=finite(points),
                    hypervolume=hypervolume,
                    n_trials=n_trials,
                    axes=",".join(axes),
                )
            )

    def add_plan(
        self,
        experiment_id: int,
        trial_index: int | None,
        plan: dict[str, Any],
        predicted: dict | None,
        confirmed: dict | None,
        path: str | None,
    ) -> None:
        with self.tx() as s:
            s.add(
                PlanRow(
                    experiment_id=experiment_id,
                    trial_index=trial_index,
                    plan=plan,
                    predicted=predicted,
                    confirmed=confirmed,
                    path=path,
                )
            )

    def fronts(self, experiment_id: int) -> list[ParetoFront]:
        with self.tx() as s:
            return list(
                s.scalars(
                    select(ParetoFront).where(ParetoFront.experiment_id == experiment_id).order_by(ParetoFront.id)
                )
            )

    def plans(self, experiment_id: int) -> list[PlanRow]:
        with self.tx() as s:
            return list(s.scalars(select(PlanRow).where(PlanRow.experiment_id == experiment_id).order_by(PlanRow.id)))

    def plan_row_of(self, doc: dict[str, Any]) -> PlanRow | None:
        """The recorded plan that the plan document ``doc`` is (the newest, if several), or None.

        The same plan is the same creation time and the same deployment: a plan file holds what was built plus
        its bundle, scenario and balance weights, and rows written before plans were recorded as written hold
        only the former, so whole documents cannot be compared. Plans are few (one per optimisation): they are
        compared here rather than by a JSON query each database spells its own way."""
        with self.tx() as s:
            rows = s.scalars(select(PlanRow).order_by(PlanRow.id.desc()))
            for r in rows:
                p = r.plan or {}
                if p.get("created_at") == doc.get("created_at") and p.get("deployment") == doc.get("deployment"):
                    return r
        return None

    # ---- verifications ----------------------------------------------------------------------------
    def add_verification(
        self, plan: PlanRow, verdict: dict[str, Any], info: dict[str, Any], plan_path: str | None = None
    ) -> int:
        """Record one ``boute verify`` of the recorded ``plan``: its verdict (``Verdict.to_dict``) and how the
        replay ran; non-finite figures (an unmeasured P95) become NULL. Returns its id."""
        with self.tx() as s:
            row = VerificationRow(
                plan_id=plan.id,
                experiment_id=plan.experiment_id,
                ok=bool(verdict.get("ok")),
                verdict=finite(verdict),
                info=finite(info),
                plan_path=plan_path,
            )
            s.add(row)
            s.flush()
            return int(row.id)

    def verifications(self, experiment_id: int) -> list[VerificationRow]:
        """The verifications of the experiment's plans, oldest first."""
        with self.tx() as s:
            q = select(VerificationRow).where(VerificationRow.experiment_id == experiment_id)
            return list(s.scalars(q.order_by(VerificationRow.id)))

    # ---- profiling runs -------------------------------------------------------------------------
    def add_profile_run(self, run: dict[str, Any], points: list[dict[str, Any]]) -> int:
        """Record a profiling run and all its load points in one transaction; returns the run id.

        ``run`` holds ``ProfileRun`` columns, each point ``ProfilePoint`` columns (``index`` defaults to the
        position in ``points``). Non-finite numbers become NULL. On any error nothing is written.
        """
        unknown = sorted(set(run) - set(_RUN_COLUMNS))
        if unknown:
            raise ValueError(f"profile run: unknown fields {unknown}")
        with self.tx() as s:
            row = ProfileRun(**{k: finite(v) for k, v in run.items()})
            for i, p in enumerate(points):
                bad = sorted(set(p) - set(_POINT_COLUMNS))
                if bad:
                    raise ValueError(f"profile point {i}: unknown fields {bad}")
                row.points.append(ProfilePoint(**{"index": i, **{k: finite(v) for k, v in p.items()}}))
            s.add(row)
            s.flush()
            return row.id

    @staticmethod
    def _run_dict(r: ProfileRun, n_points: int) -> dict[str, Any]:
        return {
            "id": r.id,
            "kind": r.kind,
            "endpoint": r.endpoint,
            "model": r.model,
            "gpu": r.gpu,
            "tp": r.tp,
            "pp": r.pp,
            "dtype": r.dtype,
            "status": r.status,
            "points": n_points,
            "settings": r.settings,
            "calibration": r.calibration,
            "calibration_path": r.calibration_path,
            "created_at": _iso(r.created_at),
        }

    def profile_runs(self, gpu: str | None = None) -> list[dict[str, Any]]:
        """Every recorded profiling run (of GPU type ``gpu`` only, when given), oldest first."""
        from sqlalchemy import func

        with self.tx() as s:
            counts = dict(s.execute(select(ProfilePoint.run_id, func.count()).group_by(ProfilePoint.run_id)).all())
            q = select(ProfileRun).order_by(ProfileRun.id)
            if gpu is not None:
                q = q.where(ProfileRun.gpu == gpu)
            return [self._run_dict(r, counts.get(r.id, 0)) for r in s.scalars(q)]

    # ---- re-planning ------------------------------------------------------------------------------
    def add_replan(self, row: dict[str, Any]) -> int:
        """Record one re-planning decision (``ReplanRow`` columns) in one transaction; returns its id."""
        with self.tx() as s:
            r = ReplanRow(**row)
            s.add(r)
            s.flush()
            return int(r.id)

    def replans(self, deployment: str | None = None) -> list[dict[str, Any]]:
        """Recorded re-planning decisions (of one deployment folder, when given), oldest first."""
        with self.tx() as s:
            q = select(ReplanRow).order_by(ReplanRow.id)
            if deployment is not None:
                q = q.where(ReplanRow.deployment == deployment)
            cols = [c.name for c in ReplanRow.__table__.columns]
            return [{c: getattr(r, c) for c in cols} for r in s.scalars(q)]

    def profile_run(self, run_id: int) -> dict[str, Any] | None:
        """One run (as in :meth:`profile_runs`), or ``None`` when no run has that id."""
        from sqlalchemy import func

        with self.tx() as s:
            r = s.get(ProfileRun, run_id)
            if r is None:
                return None
            n = s.scalar(select(func.count()).select_from(ProfilePoint).where(ProfilePoint.run_id == run_id))
            return self._run_dict(r, int(n or 0))

    def profile_points(self, run_id: int) -> list[dict[str, Any]]:
        """The load points of run ``run_id`` in sweep order (empty when there is no such run)."""
        with self.tx() as s:
            rows = s.scalars(select(ProfilePoint).where(ProfilePoint.run_id == run_id).order_by(ProfilePoint.index))
            return [{k: getattr(p, k) for k in _POINT_COLUMNS} for p in rows]

    def close(self) -> None:
        self.engine.dispose()


def open_store(url: str | None = None) -> Store:
    """Connect, apply migrations, return the store; an unreachable or bad URL is a one-line BouteError."""
    url = normalise_url(url)
    try:
        engine = create_engine(url)
        if engine.dialect.name == "sqlite":
            db_file = engine.url.database
            if db_file and db_file != ":memory:" and not db_file.startswith("file:"):
                # a new database file's folder is made, as the plan's folder is: `--db sqlite:///runs/b.db`
                Path(db_file).parent.mkdir(parents=True, exist_ok=True)

            @event.listens_for(engine, "connect")
            def _pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA foreign_keys=ON")
                cur.execute("PRAGMA busy_timeout=10000")
                # write-ahead log, synced at checkpoints: a committed trial survives the process being killed
                # (what resuming needs); only an OS crash can lose the last ones. The default (a rollback
                # journal synced at every commit) spent 4.8-6.8 s of a 12-28 s fast-path search writing its
                # 2,000 trials, one transaction each (bench optimize_scale, "record")
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.close()

        migrate(engine)
    except (SQLAlchemyError, ImportError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BouteError(f"--db: cannot open tracking database {url}: {first}") from None
    return Store(engine)
