"""Re-planning decisions (``boute replan``): triggers with evidence, old and new plan, predicted gain.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replans",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("deployment", sa.String(1000), nullable=False, index=True),
        sa.Column("triggers", sa.JSON, nullable=False),
        sa.Column("old_plan", sa.JSON, nullable=False),
        sa.Column("new_plan", sa.JSON, nullable=True),
        sa.Column("observed", sa.JSON, nullable=False),
        sa.Column("gain", sa.JSON, nullable=True),
        sa.Column("experiment", sa.String(200), nullable=True),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("detail", sa.Text, nullable=True),
        sa.Column("wall_s", sa.Float, nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("replans")
