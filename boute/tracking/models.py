"""SQLAlchemy 2.0 models of experiment tracking: experiments, trials, Pareto fronts, plans, verifications,
profiling runs.

JSON columns hold what varies by strategy and evaluator (parameters, metrics, plan documents); the fixed
columns are what queries filter and order on. ``(experiment_id, index)`` is unique: a trial can never be
recorded twice, which is what makes resuming safe. ``profile_runs``/``profile_points`` hold what ``boute
profile perf`` measured (one row per load point; a metric that could not be measured is NULL, never NaN).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def _now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Experiment(Base):
    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True, index=True)
    scenario: Mapped[str] = mapped_column(String(200))
    strategy: Mapped[str] = mapped_column(String(40))
    evaluator: Mapped[str] = mapped_column(String(40))
    seed: Mapped[int] = mapped_column(Integer, default=0)
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(20), default="running")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now, onupdate=_now)

    trials: Mapped[list[TrialRow]] = relationship(
        back_populates="experiment", cascade="all, delete-orphan", order_by="TrialRow.index"
    )


class TrialRow(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("experiment_id", "index", name="uq_trials_experiment_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20))
    evaluator: Mapped[str] = mapped_column(String(40))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    wall_s: Mapped[float] = mapped_column(Float, default=0.0)  # the evaluation's own seconds
    # seconds of the experiment's runs when the trial was recorded (migration 0005): from the run's start,
    # plus what earlier runs of a resumed experiment took; NULL for trials recorded before it was kept
    elapsed_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

    experiment: Mapped[Experiment] = relationship(back_populates="trials")


class ParetoFront(Base):
    __tablename__ = "pareto_fronts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    evaluator: Mapped[str] = mapped_column(String(40))
    points: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    hypervolume: Mapped[float] = mapped_column(Float)
    n_trials: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
    # comma-separated EvalResult fields the front is over (migration 0003): "quality,p95_latency_s" for the
    # latency objective, "quality,p95_latency_s,cost_per_hour" for cost and pareto
    axes: Mapped[str] = mapped_column(String(200), default="quality,p95_latency_s")


class PlanRow(Base):
    __tablename__ = "plans"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    trial_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    predicted: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    confirmed: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    path: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class VerificationRow(Base):
    """One ``boute verify`` of a recorded plan (migration 0005): its verdict (``Verdict.to_dict``: every check
    promised vs measured, the measurement) and how the replay ran (rate, duration, gateway), for the report."""

    __tablename__ = "verifications"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    ok: Mapped[bool] = mapped_column(Boolean)
    verdict: Mapped[dict[str, Any]] = mapped_column(JSON)
    info: Mapped[dict[str, Any]] = mapped_column(JSON)
    plan_path: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)


class ProfileRun(Base):
    """One profiling run (``kind`` "perf": a load sweep of one endpoint and the factors fitted to it)."""

    __tablename__ = "profile_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(20), default="perf")
    endpoint: Mapped[str] = mapped_column(String(1000))
    model: Mapped[str] = mapped_column(String(200))
    gpu: Mapped[str] = mapped_column(String(100), index=True)
    tp: Mapped[int] = mapped_column(Integer, default=1)
    pp: Mapped[int] = mapped_column(Integer, default=1)
    dtype: Mapped[str] = mapped_column(String(20), default="bf16")
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    calibration: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    calibration_path: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    status: Mapped[str] = mapped_column(String(20), default="complete")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

    points: Mapped[list[ProfilePoint]] = relationship(
        back_populates="run", cascade="all, delete-orphan", order_by="ProfilePoint.index"
    )


class ProfilePoint(Base):
    """One measured load point: request shape and load, then the aggregates of ``loadgen.PointResult``."""

    __tablename__ = "profile_points"
    __table_args__ = (UniqueConstraint("run_id", "index", name="uq_profile_points_run_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("profile_runs.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    concurrency: Mapped[int] = mapped_column(Integer)
    rate_rps: Mapped[float | None] = mapped_column(Float, nullable=True)
    input_len: Mapped[int] = mapped_column(Integer)  # requested prompt tokens
    output_len: Mapped[int] = mapped_column(Integer)  # requested output tokens
    requests: Mapped[int] = mapped_column(Integer)
    completed: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[float | None] = mapped_column(Float, nullable=True)  # measured mean
    output_tokens: Mapped[float | None] = mapped_column(Float, nullable=True)  # measured mean
    ttft_ms_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttft_ms_p50: Mapped[float | None] = mapped_column(Float, nullable=True)
    ttft_ms_p95: Mapped[float | None] = mapped_column(Float, nullable=True)
    tpot_ms_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    tpot_ms_p50: Mapped[float | None] = mapped_column(Float, nullable=True)
    e2e_ms_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    throughput_rps: Mapped[float | None] = mapped_column(Float, nullable=True)
    output_tokens_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    wall_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    errors: Mapped[list[str]] = mapped_column(JSON, default=list)

    run: Mapped[ProfileRun] = relationship(back_populates="points")


class ReplanRow(Base):
    """One re-planning decision of ``boute replan``: what triggered it (with the evidence), the plan that ran,
    the plan proposed for the observed workload, the predicted gain, and what became of it."""

    __tablename__ = "replans"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment: Mapped[str] = mapped_column(String(1000), index=True)
    triggers: Mapped[list[dict[str, Any]]] = mapped_column(JSON)  # [{kind, at, evidence}]
    old_plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    new_plan: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    observed: Mapped[dict[str, Any]] = mapped_column(JSON)  # the window's summary
    gain: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # old vs new under the observed load
    experiment: Mapped[str | None] = mapped_column(String(200), nullable=True)
    status: Mapped[str] = mapped_column(
        String(20)
    )  # proposed (dry run) | deployed | kept | infeasible | failed; detail: why
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    wall_s: Mapped[float] = mapped_column(Float, default=0.0)  # trigger to plan live (or to the verdict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)
