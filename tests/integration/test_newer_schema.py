"""A database a newer agent-runtime migrated (a rollback onto it): every command that
opens it refuses in one line, exit 2, before the store writes anything to it."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from runtime.backend import open_backend
from runtime.store.schema import MIGRATIONS
from server.settings import Settings
from tests.integration.test_cli_refusals import agent_runtime, assert_one_line_refusal


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_a_database_a_newer_version_migrated_is_refused_in_one_line(
    tmp_path: Path, database_url: str, command: str
) -> None:
    """A rollback onto a migrated database: refused before the start, not by the store
    inside it (a traceback), and the database is left as it was."""

    newer = len(MIGRATIONS) + 1

    async def migrated_by_a_newer_version() -> None:
        backend = await open_backend(database_url)
        try:
            async with backend.store.tx() as tx:
                await tx.execute("INSERT INTO schema_version (version) VALUES (?)", (newer,))
        finally:
            await backend.close()

    asyncio.run(migrated_by_a_newer_version())
    args = (command, "--port", "0") if command == "serve" else (command,)
    done = agent_runtime(tmp_path, *args, AGENT_RUNTIME_DATABASE_URL=database_url)
    assert_one_line_refusal(done, "AGENT_RUNTIME_DATABASE_URL", f"version {newer}, newer")


def test_the_schema_check_reads_the_stores_own_table(pg_base_url: str) -> None:
    """Along a search_path, another application's schema_version (a higher number, or
    Flyway's text versions) is not the store's: the store makes its own in the first
    schema, and a fresh deployment there must start."""
    from server.preflight import reach_the_database

    own, other = (f"t_{uuid.uuid4().hex[:12]}" for _ in range(2))
    with psycopg.connect(pg_base_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {own}")
        conn.execute(f"CREATE SCHEMA {other}")
        conn.execute(f"CREATE TABLE {other}.schema_version (version INTEGER NOT NULL)")
        conn.execute(f"INSERT INTO {other}.schema_version VALUES (42)")
    try:
        sep = "&" if "?" in pg_base_url else "?"
        url = f"{pg_base_url}{sep}options={quote(f'-csearch_path={own},{other}')}"
        reach_the_database(Settings(database_url=url))  # not "version 42, newer"
        with psycopg.connect(pg_base_url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {own}.schema_version (version TEXT NOT NULL)")
            conn.execute(f"INSERT INTO {own}.schema_version VALUES ('4.1')")
        reach_the_database(Settings(database_url=url))  # not a TypeError
    finally:
        with psycopg.connect(pg_base_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {own} CASCADE")
            conn.execute(f"DROP SCHEMA {other} CASCADE")
