"""Experiment tracking: SQLAlchemy models + Alembic migrations (SQLite by default, PostgreSQL by URL)."""

from boute.tracking.store import DEFAULT_URL, Store, normalise_url, open_store

__all__ = ["DEFAULT_URL", "Store", "normalise_url", "open_store"]
