"""Fixtures shared by every test: a database per test on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

PG_URL = os.environ.get("AGENT_RUNTIME_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(autouse=True)
def _fresh_breakers() -> Iterator[None]:
    """Circuit breakers are per process; one test's failures must not open another's."""
    from runtime.breaker import BREAKERS

    BREAKERS.reset()
    yield
    BREAKERS.reset()


@pytest.fixture(scope="session")
def pg_base_url() -> str:
    """PostgreSQL must be reachable: its tests fail, they are never skipped."""
    try:
        with psycopg.connect(PG_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_URL} is unreachable: {exc}")
    return PG_URL


@pytest.fixture
def pg_schema_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A URL whose search_path is a fresh schema, dropped after the test."""
    base = request.getfixturevalue("pg_base_url")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runtime.db'}"
    url: str = request.getfixturevalue("pg_schema_url")
    return url


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
async def backend(database_url: str) -> AsyncIterator[object]:
    from runtime.backend import open_backend

    opened = await open_backend(database_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture(autouse=True)
def _nothing_in_a_checkpoint_unrevived() -> Iterator[None]:
    """The runtime's checkpointers revive only the types they list
    (runtime.backend.CHECKPOINT_SERDE): one a run's state holds unlisted comes back as
    its bare payload, which no test would otherwise notice."""
    from langgraph.checkpoint.serde.event_hooks import SerdeEvent, register_serde_event_listener

    blocked: list[SerdeEvent] = []

    def listen(event: SerdeEvent) -> None:
        if "blocked" in event["kind"]:  # msgpack_blocked, msgpack_method_blocked
            blocked.append(event)

    unregister = register_serde_event_listener(listen)
    try:
        yield
    finally:
        unregister()
    assert blocked == [], f"LangGraph did not revive these from a checkpoint: {blocked}"
