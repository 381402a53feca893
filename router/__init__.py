"""BOute's gateway: an OpenAI-compatible router that applies a plan to live traffic (see docs/router.md)."""

from typing import Any

from router.config import Settings

__all__ = ["Settings", "create_app"]


def create_app(*args: Any, **kwargs: Any) -> Any:
    """:func:`router.app.create_app`, imported on first call: ``import router`` stays light (no FastAPI)."""
    from router.app import create_app as _create

    return _create(*args, **kwargs)
