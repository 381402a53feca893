"""Schemathesis fuzzing of the gateway's own OpenAPI spec: whatever arrives, the gateway never answers 5xx.

Driven through schemathesis' Python API (operation strategies + hypothesis) rather than its pytest
plugin, which does not load under this pytest version.
"""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st

from tests.stack import Stack

pytestmark = pytest.mark.timeout(120)  # every test here starts processes (a hang fails in 2 min, not 15)

EXAMPLES_PER_OPERATION = 8


def test_no_server_errors_from_fuzzed_requests() -> None:
    stack = Stack.start(speedup=200)
    try:
        url, _ = stack.gateway(BOUTE_ADMIN_TOKEN="fuzz", BOUTE_MAX_BODY_BYTES="4096")
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        operations = [r.ok() for r in schema.get_all_operations()]
        assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/admin/plan"}
        calls = 0
        for op in operations:

            @hypothesis.given(case=op.as_strategy(), data=st.data())
            @hypothesis.settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                suppress_health_check=list(hypothesis.HealthCheck),
                database=None,
            )
            def check(case: schemathesis.Case, data: st.DataObject) -> None:
                nonlocal calls
                if isinstance(case.body, dict) and isinstance(case.body.get("max_tokens"), int):
                    case.body["max_tokens"] = min(case.body["max_tokens"], 64)  # keep generated answers short
                if data.draw(st.booleans()):
                    case.headers = {**(case.headers or {}), "Authorization": "Bearer fuzz"}
                case.call_and_validate(checks=[schemathesis.checks.not_a_server_error], timeout=30)
                calls += 1

            check()
        assert calls >= EXAMPLES_PER_OPERATION * len(operations) // 2
    finally:
        stack.stop()
