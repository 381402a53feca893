"""Shared fixtures: real Redis and PostgreSQL (as the machine runs them), the built-in scenario, emulated
replicas behind gateways."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.stack import Stack


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis the suite runs against (``tests.services`` starts an embedded one if none answers)."""
    url = os.environ.get("BOUTE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    if not _answers(host, int(port)):
        pytest.fail(f"no Redis at {url}: run the suite through `make test` (python -m tests.services pytest)")
    return url


@pytest.fixture(scope="session")
def pg_url() -> str:
    """The machine's PostgreSQL (trust auth, database `test`); skipped where none runs."""
    url = os.environ.get("BOUTE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    if not _answers("127.0.0.1", 5432):
        pytest.skip("no PostgreSQL on 127.0.0.1:5432")
    return url


@pytest.fixture(scope="session")
def scenario():
    from boute.specs import load_scenario

    return load_scenario(None)


@pytest.fixture(scope="session")
def poisson_scenario():
    """The built-in scenario with Poisson arrivals instead of the trace's: what the simulator and the fast path
    are compared on. Scenarios are frozen, so one serves the whole session."""
    from boute.specs import load_scenario

    s = load_scenario(None)
    w = s.workload
    return s.model_copy(
        update={"workload": w.model_copy(update={"arrivals": w.arrivals.model_copy(update={"kind": "poisson"})})}
    )


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """TEST_PLAN's emulated replicas (speedup 50), for one test module to put its own gateways in front of.
    Per module, not per session: some modules kill replicas, and gateways left running would keep polling."""
    from tests.stack import Stack

    st = Stack.start(speedup=50)
    try:
        yield st
    finally:
        st.stop()


@pytest.fixture()
def judge_url() -> Iterator[str]:
    """An LLM judge over real HTTP (:class:`tests.judge_server.FakeJudge`; the test sets its reply)."""
    from tests.judge_server import serve_judge

    with serve_judge() as url:
        yield url
