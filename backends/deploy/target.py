"""The interface every deployment target implements: start a replica somewhere, get a handle back."""

from __future__ import annotations

from typing import Any, Protocol

from backends.deploy.desired import ReplicaKey


class ReplicaHandle(Protocol):
    key: ReplicaKey
    url: str

    def wait_ready(self, timeout_s: float) -> float: ...

    def info(self) -> dict[str, Any]: ...  # pid, restarts, node, resources: for status and tests

    def stop(self, grace_s: float = 10.0) -> None: ...


class Target(Protocol):
    name: str

    def start(self, key: ReplicaKey) -> ReplicaHandle: ...

    def close(self) -> None: ...
