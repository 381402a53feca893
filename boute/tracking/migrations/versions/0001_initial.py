"""Initial schema: experiments, trials, pareto_fronts, plans.

Revision ID: 0001
Revises:
Create Date: 2026-03-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("scenario", sa.String(200), nullable=False),
        sa.Column("strategy", sa.String(40), nullable=False),
        sa.Column("evaluator", sa.String(40), nullable=False),
        sa.Column("seed", sa.Integer, nullable=False),
        sa.Column("settings", sa.JSON, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_experiments_name", "experiments", ["name"], unique=True)
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("experiment_id", sa.Integer, sa.ForeignKey("experiments.id", ondelete="CASCADE"), nullable=False),
        sa.Column("index", sa.Integer, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("evaluator", sa.String(40), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("metrics", sa.JSON, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("wall_s", sa.Float, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=False),
        sa.UniqueConstraint("experiment_id", "index", name="uq_trials_experiment_index"),
    )
    op.create_index("ix_trials_experiment_id", "trials", ["experiment_id"])
    op.create_table(
        "pareto_fronts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("experiment_id", sa.Integer, sa.ForeignKey("experiments.id", ondelete="CASCADE"), nullable=False),
        sa.Column("evaluator", sa.String(40), nullable=False),
        sa.Column("points", sa.JSON, nullable=False),
        sa.Column("hypervolume", sa.Float, nullable=False),
        sa.Column("n_trials", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_pareto_fronts_experiment_id", "pareto_fronts", ["experiment_id"])
    op.create_table(
        "plans",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("experiment_id", sa.Integer, sa.ForeignKey("experiments.id", ondelete="CASCADE"), nullable=False),
        sa.Column("trial_index", sa.Integer, nullable=True),
        sa.Column("plan", sa.JSON, nullable=False),
        sa.Column("predicted", sa.JSON, nullable=True),
        sa.Column("confirmed", sa.JSON, nullable=True),
        sa.Column("path", sa.String(1000), nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_plans_experiment_id", "plans", ["experiment_id"])


def downgrade() -> None:
    op.drop_table("plans")
    op.drop_table("pareto_fronts")
    op.drop_table("trials")
    op.drop_table("experiments")
