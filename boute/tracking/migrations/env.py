"""Alembic environment: uses the connection BOute passes in, else the URL from ``-x url=`` or the ini."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from boute.tracking.models import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("alembic: no database URL (pass -x url=... or set sqlalchemy.url in alembic.ini)")
    engine = create_engine(url)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        conn.commit()


run()
