"""The replicas' bearer token: one environment variable, read here and nowhere else.

A replica listening beyond loopback is an unauthenticated LLM endpoint unless it asks for a token. With
``BOUTE_REPLICA_TOKEN`` set, the deployer hands it to every replica it starts (SGLang's ``--api-key``, the
emulated backend's own check), and the gateway and the controller send it (``Authorization: Bearer ...``)
on every upstream request. The rule is SGLang's (``add_api_key_middleware``): ``OPTIONS``, ``/health*`` and
``/metrics`` stay open (liveness probes carry no secret); anything else without the exact header is 401.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping

#: the environment variable holding the token (unset or empty: replicas answer anyone who reaches them)
TOKEN_ENV = "BOUTE_REPLICA_TOKEN"
#: what a replica answers without the token (SGLang's body and status)
UNAUTHORIZED_STATUS = 401
UNAUTHORIZED_BODY = b'{"error": "Unauthorized"}'


def replica_token(env: Mapping[str, str] | None = None) -> str | None:
    """The token from ``env`` (default: this process's environment); None when unset or empty."""
    value = (os.environ if env is None else env).get(TOKEN_ENV, "")
    return value or None


def bearer(token: str) -> str:
    """The ``Authorization`` header value carrying ``token``."""
    return f"Bearer {token}"


def auth_headers(token: str | None) -> dict[str, str]:
    """Request headers for a replica: the bearer header when there is a token, else none."""
    return {"Authorization": bearer(token)} if token else {}


def open_path(method: str, path: str) -> bool:
    """Requests a protected replica still answers without the token (probes, as SGLang leaves them open)."""
    return method == "OPTIONS" or path.startswith("/health") or path == "/metrics"


def authorized(header: str | bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (compared in constant time)."""
    if header is None:
        return False
    given = header if isinstance(header, bytes) else header.encode("latin-1", "replace")
    return hmac.compare_digest(given, bearer(token).encode("latin-1", "replace"))
