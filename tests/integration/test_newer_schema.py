"""A database a newer agent-runtime migrated (a rollback onto it): every command that
opens it refuses in one line, exit 2, before the store writes anything to it."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from runtime.backend import open_backend, sqlite_path
from runtime.lifecycle import State
from runtime.store.schema import MIGRATIONS
from server.auth.keys import create_key
from server.settings import Settings
from tests.integration.test_cli_refusals import agent_runtime, assert_one_line_refusal
from tests.unit.conftest import build_run

NEWER = len(MIGRATIONS) + 1


async def migrated_by_a_newer_version(url: str) -> str:
    """The database with a key and a run that ended long ago (what ``keys revoke`` and
    ``prune`` would write to), then migrated past this version: the key's id."""
    backend = await open_backend(url)
    try:
        key = await create_key(backend.store, tenant_id="t1", user_id="u1")
        run, _ = await backend.store.create_run(build_run(), "hash")
        async with backend.store.tx() as tx:
            await tx.execute(
                "UPDATE runs SET state = ?, ended_at = ? WHERE run_id = ?",
                (State.FAILED.value, "2001-01-01T00:00:00Z", run.run_id),
            )
            await tx.execute("INSERT INTO schema_version (version) VALUES (?)", (NEWER,))
    finally:
        await backend.close()
    return key.key_id


def contents(url: str) -> list[str]:
    """Every table of the store's database and its rows, as text: what any write changes."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(sqlite_path(url))) as conn:
            return list(conn.iterdump())
    with psycopg.connect(url) as pg:
        tables = pg.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() ORDER BY table_name"
        ).fetchall()
        return [
            f"{table}: {sorted(map(repr, pg.execute(f'SELECT * FROM {table}').fetchall()))}"
            for (table,) in tables
        ]


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_a_database_a_newer_version_migrated_is_refused_in_one_line(
    tmp_path: Path, database_url: str, command: str
) -> None:
    """A rollback onto a migrated database: refused before the start, not by the store
    inside it (a traceback), and the database is left as it was."""
    asyncio.run(migrated_by_a_newer_version(database_url))
    before = contents(database_url)
    args = (command, "--port", "0") if command == "serve" else (command,)
    done = agent_runtime(tmp_path, *args, AGENT_RUNTIME_DATABASE_URL=database_url)
    assert_one_line_refusal(done, "AGENT_RUNTIME_DATABASE_URL", f"version {NEWER}, newer")
    assert contents(database_url) == before


@pytest.mark.parametrize(
    "command",
    [
        ("keys", "create", "--tenant", "t1", "--user", "u2"),
        ("keys", "list"),
        ("keys", "revoke", "{key_id}"),
        ("prune", "--older-than", "0"),
        ("prune", "--older-than", "0", "--dry-run"),
    ],
)
def test_the_admin_commands_refuse_it_as_the_server_does(
    tmp_path: Path, database_url: str, command: tuple[str, ...]
) -> None:
    """They open the store straight in the database: the store's own check refused it
    there, but in a traceback. Refused before it opens, nothing is written (no key made
    or revoked, no run pruned, the schema left at the newer version)."""
    key_id = asyncio.run(migrated_by_a_newer_version(database_url))
    before = contents(database_url)
    args = [arg.format(key_id=key_id) for arg in command]
    done = agent_runtime(tmp_path, *args, AGENT_RUNTIME_DATABASE_URL=database_url)
    assert_one_line_refusal(
        done, f"agent-runtime {command[0]}: AGENT_RUNTIME_DATABASE_URL", f"version {NEWER}, newer"
    )
    assert done.stdout == ""
    assert contents(database_url) == before
    # (What it compared: the newer version, the key, the run, each as stored.)
    for table, holds in (("schema_version", f"({NEWER}"), ("api_keys", key_id), ("runs", "2001")):
        assert any(table in line and holds in line for line in before), (table, before)


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
