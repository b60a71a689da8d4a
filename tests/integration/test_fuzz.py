"""Property-based fuzzing of the real server from its own OpenAPI document (schemathesis):
whatever a caller sends, no 5xx, and every response matches what the schema documents.

A bounded number of examples per operation keeps this within the suite's time budget.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.auth import OPS
from tests.integration.server_proc import ServerProcess

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def test_no_5xx_and_responses_match_the_schema(server: ServerProcess) -> None:
    server.start()
    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")
    # The SSE stream of a live run never ends by itself: ask for the JSON form.
    headers = {**OPS, "Accept": "application/json"}
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()  # the server's own schema is valid
        operations.append(result.ok())
    assert len(operations) >= 14

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=15,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def fuzz(case: schemathesis.Case) -> None:
            case.call_and_validate(headers=headers, checks=CHECKS, timeout=30)

        fuzz()
