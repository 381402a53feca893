"""Profiling runs: profile_runs (one `boute profile perf` sweep + its fit) and profile_points (one per load point).

Revision ID: 0002
Revises: 0001
Create Date: 2026-03-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "profile_runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("endpoint", sa.String(1000), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("gpu", sa.String(100), nullable=False),
        sa.Column("tp", sa.Integer, nullable=False),
        sa.Column("pp", sa.Integer, nullable=False),
        sa.Column("dtype", sa.String(20), nullable=False),
        sa.Column("settings", sa.JSON, nullable=False),
        sa.Column("calibration", sa.JSON, nullable=True),
        sa.Column("calibration_path", sa.String(1000), nullable=True),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_profile_runs_gpu", "profile_runs", ["gpu"])
    op.create_table(
        "profile_points",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("profile_runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("index", sa.Integer, nullable=False),
        sa.Column("concurrency", sa.Integer, nullable=False),
        sa.Column("rate_rps", sa.Float, nullable=True),
        sa.Column("input_len", sa.Integer, nullable=False),
        sa.Column("output_len", sa.Integer, nullable=False),
        sa.Column("requests", sa.Integer, nullable=False),
        sa.Column("completed", sa.Integer, nullable=False),
        sa.Column("failed", sa.Integer, nullable=False),
        sa.Column("input_tokens", sa.Float, nullable=True),
        sa.Column("output_tokens", sa.Float, nullable=True),
        sa.Column("ttft_ms_mean", sa.Float, nullable=True),
        sa.Column("ttft_ms_p50", sa.Float, nullable=True),
        sa.Column("ttft_ms_p95", sa.Float, nullable=True),
        sa.Column("tpot_ms_mean", sa.Float, nullable=True),
        sa.Column("tpot_ms_p50", sa.Float, nullable=True),
        sa.Column("e2e_ms_mean", sa.Float, nullable=True),
        sa.Column("throughput_rps", sa.Float, nullable=True),
        sa.Column("output_tokens_per_s", sa.Float, nullable=True),
        sa.Column("wall_s", sa.Float, nullable=True),
        sa.Column("errors", sa.JSON, nullable=False),
        sa.UniqueConstraint("run_id", "index", name="uq_profile_points_run_index"),
    )
    op.create_index("ix_profile_points_run_id", "profile_points", ["run_id"])


def downgrade() -> None:
    op.drop_table("profile_points")
    op.drop_table("profile_runs")
