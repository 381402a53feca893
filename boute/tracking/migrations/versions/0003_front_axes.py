"""Pareto fronts name their axes: (quality, P95) for the latency objective, (quality, P95, $/h) for cost/pareto.

Revision ID: 0003
Revises: 0002
Create Date: 2026-04-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

#: every front recorded before this revision is a (quality, P95) front
LEGACY_AXES = "quality,p95_latency_s"


def upgrade() -> None:
    # batch mode: SQLite cannot ALTER a column's constraints in place; PostgreSQL runs it as one ALTER TABLE
    with op.batch_alter_table("pareto_fronts") as batch:
        batch.add_column(sa.Column("axes", sa.String(200), nullable=False, server_default=LEGACY_AXES))


def downgrade() -> None:
    with op.batch_alter_table("pareto_fronts") as batch:
        batch.drop_column("axes")
