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
        # Paces that keep a process busy doing nothing (a probe: 95 % of a core idle).
        ("RETENTION_INTERVAL_S", "0.000001"),
        ("SSE_KEEPALIVE_S", "0.000001"),
        ("DRIVE_RETRY_SECONDS", "0.000001"),
        # Unbounded: never taken over, not writable into a run (JSON has no Infinity),
        # past 64 bits (no checkpoint can hold it), a wait that never ends.
        ("LEASE_SECONDS", "inf"),
        ("MAX_COST_USD", "inf"),
        ("MAX_TIMEOUT_S", "Infinity"),
        ("SHUTDOWN_GRACE_S", "inf"),
        ("DRIVE_RETRY_SECONDS", "nan"),
        ("MAX_TOKENS", "99999999999999999999999"),
        ("MAX_STEPS", "100000"),  # more than any request may ask for
        ("MAX_JSON_DEPTH", "5000"),  # deeper than the parser can recurse
        ("DATABASE_URL", "mysql://db/x"),
        ("DATABASE_URL", "sqlite://relative.db"),
        ("LOG_LEVEL", "loud"),
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
    monkeypatch.setenv("AGENT_RUNTIME_RETENTION_INTERVAL_S", "1")
    settings = Settings()
    assert (settings.lease_seconds, settings.worker_concurrency, settings.max_steps) == (1, 1, 1)
    assert settings.retention_interval_s == 1


def test_a_variable_set_empty_means_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AGENT_RUNTIME_DATABASE_URL=`` in a compose file or a shell is "not set": the
    embedded default, not a refusal (nor a number's or a secret's empty value)."""
    for name in ("DATABASE_URL", "LEASE_SECONDS", "JWT_HS256_SECRET", "PLANNER_MODEL"):
        monkeypatch.setenv(f"AGENT_RUNTIME_{name}", "")
    monkeypatch.setenv("AGENT_RUNTIME_DATA_DIR", "/srv/agents")
    settings = Settings()
    assert settings.resolved_database_url == "sqlite:////srv/agents/runtime.db"
    assert settings.lease_seconds == 30.0
    assert settings.jwt_hs256_secret is None and settings.planner_model is None
