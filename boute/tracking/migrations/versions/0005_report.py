"""What ``boute report`` reads that was not recorded: each trial's place in the run's wall time, and the
verdicts of ``boute verify`` against the plans they checked. Additive: rows of older versions read as before
(their ``elapsed_s`` is NULL: the report says their wall time was not recorded).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("elapsed_s", sa.Float, nullable=True))
    op.create_table(
        "verifications",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("plan_id", sa.Integer, sa.ForeignKey("plans.id", ondelete="CASCADE"), nullable=False),
        sa.Column("experiment_id", sa.Integer, sa.ForeignKey("experiments.id", ondelete="CASCADE"), nullable=False),
        sa.Column("ok", sa.Boolean, nullable=False),
        sa.Column("verdict", sa.JSON, nullable=False),
        sa.Column("info", sa.JSON, nullable=False),
        sa.Column("plan_path", sa.String(1000), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_verifications_plan_id", "verifications", ["plan_id"])
    op.create_index("ix_verifications_experiment_id", "verifications", ["experiment_id"])


def downgrade() -> None:
    op.drop_index("ix_verifications_experiment_id", "verifications")
    op.drop_index("ix_verifications_plan_id", "verifications")
    op.drop_table("verifications")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("elapsed_s")
