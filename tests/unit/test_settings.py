"""Settings that would start a server that cannot work are refused as it starts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from server.settings import Settings


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LEASE_SECONDS", "0"),  # every lease lost as it is taken: no run ever finished
        ("LEASE_SECONDS", "0.2"),
        ("WORKER_CONCURRENCY", "0"),
        ("WORKER_CONCURRENCY", "-1"),
        ("MAX_BODY_BYTES", "-1"),
        ("MAX_JSON_DEPTH", "0"),
        ("MAX_STEPS", "0"),
        ("MAX_TOKENS", "0"),
        ("MAX_COST_USD", "0"),
        ("MAX_TIMEOUT_S", "-5"),
        ("MAX_ACTIVE_RUNS_PER_TENANT", "0"),
        ("MAX_STREAMS_PER_PRINCIPAL", "0"),
        ("SSE_KEEPALIVE_S", "0"),
        ("SHUTDOWN_GRACE_S", "-1"),
    ],
)
def test_a_setting_no_server_can_work_with_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(f"AGENT_RUNTIME_{name}", value)
    with pytest.raises(ValidationError, match=name.lower()):
        Settings()


def test_the_defaults_and_the_smallest_working_values_are_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().lease_seconds == 30.0
    for name, value in (("LEASE_SECONDS", "1"), ("WORKER_CONCURRENCY", "1"), ("MAX_STEPS", "1")):
        monkeypatch.setenv(f"AGENT_RUNTIME_{name}", value)
    settings = Settings()
    assert (settings.lease_seconds, settings.worker_concurrency, settings.max_steps) == (1, 1, 1)
