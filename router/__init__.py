"""BOute's gateway: an OpenAI-compatible router that applies a plan to live traffic (see docs/router.md)."""

from typing import Any

from router.config import Settings

__all__ = ["Settings", "create_app"]


def create_app(*args, **kwargs) -> Any:  # noqa: ANN002, ANN003 - thin lazy re-export (keeps `import router` light)
    from router.app import create_app as _create

    return _create(*args, **kwargs)
