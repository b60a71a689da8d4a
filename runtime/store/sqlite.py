"""The embedded run store: one SQLite file, one connection, transactions serialised in-process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from runtime.aio import to_the_end
from runtime.store.base import Row, RunStore
from runtime.store.codec import decode_text

BUSY_TIMEOUT_MS = 10_000
"""How long a transaction waits for SQLite's write lock before it fails."""


class _DirectTx:
    """Statements run on the event loop's thread, straight on the sqlite3 connection.

    Through aiosqlite each statement is a hop to its thread and back (a queue, a
    future, a wake-up of the loop): most of the store's cost, for statements that
    take microseconds. Here only what may wait goes through aiosqlite's thread:
    COMMIT (the fsync), and BEGIN IMMEDIATE when SQLite's write lock is held by
    another connection (the checkpointer's): :meth:`try_begin` takes a free lock
    without waiting. Statements inside our own transaction hold that lock, so they
    never wait; a lone read in WAL mode does not wait for writers.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def try_begin(self) -> bool:
        """BEGIN IMMEDIATE if the write lock is free now; False (nothing begun) if not."""
        # busy_timeout 0 for this statement only: the loop's thread must not sleep in
        # SQLite's busy handler. The caller waits for the lock on aiosqlite's thread.
        self._conn.execute("PRAGMA busy_timeout=0")
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:  # or an extended BUSY_*
                raise
            return False
        finally:
            self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        return True

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._conn.execute(sql, tuple(params))

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        row = self._conn.execute(sql, tuple(params)).fetchone()
        return dict(row) if row is not None else None

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return [dict(r) for r in self._conn.execute(sql, tuple(params)).fetchall()]


class _ThreadTx:
    """Every statement through aiosqlite's thread: where the loop must never block
    (a LangGraph server running our graphs refuses any blocking call)."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        await self._conn.execute(sql, tuple(params))

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        async with self._conn.execute(sql, tuple(params)) as cur:
            row = await cur.fetchone()
        return dict(row) if row is not None else None

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        async with self._conn.execute(sql, tuple(params)) as cur:
            rows = await cur.fetchall()
        return [dict(r) for r in rows]


async def close_quietly(conn: aiosqlite.Connection) -> None:
    """Close a connection being given up on: its thread would keep the process alive."""
    with contextlib.suppress(Exception):
        await conn.close()


def _private_file(path: Path) -> None:
    """Create the database file readable by its owner alone: it holds tool arguments
    marked secret, and SQLite gives its -wal and -shm files the same mode. A file that
    exists keeps the mode its operator gave it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


class SqliteRunStore(RunStore):
    dialect = "sqlite"
    blob_type = "BLOB"
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, conn: aiosqlite.Connection, *, direct: bool = True) -> None:
        super().__init__()
        self._conn = conn
        # One connection: transactions must not interleave on it.
        self._lock = asyncio.Lock()
        self._statements: _DirectTx | _ThreadTx = (
            _DirectTx(conn._conn) if direct else _ThreadTx(conn)
        )

    def index_hint(self, index: str) -> str:
        return f" INDEXED BY {index}"

    @classmethod
    async def open(cls, path: Path, *, direct: bool = True) -> SqliteRunStore:
        """``direct``: run statements on the loop's thread (:class:`_DirectTx`); False
        where the loop must never block."""
        # In a thread: a LangGraph server refuses blocking calls inside a run.
        await asyncio.to_thread(_private_file, path)
        # Not bound to aiosqlite's thread: _DirectTx runs statements on the loop's.
        conn = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
        try:
            conn.row_factory = aiosqlite.Row
            conn.text_factory = decode_text  # bad UTF-8 in one row must not fail the read
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            # FULL, not NORMAL: in WAL mode NORMAL skips the fsync at commit, so a power
            # loss can roll back commits that were already acted on (a ledger row claimed
            # before its side effect ran would vanish, and the effect would run again).
            # The cost is one fsync per transaction, which is why the store batches writes.
            await conn.execute("PRAGMA synchronous=FULL")
            store = cls(conn, direct=direct)
            await store.migrate()
        except BaseException:
            await close_quietly(conn)
            raise
        return store

    @asynccontextmanager
    async def _tx(
        self, on_commit: Callable[[], None] | None = None
    ) -> AsyncIterator[_DirectTx | _ThreadTx]:
        # A caller cancelled mid-transaction (an SSE client hanging up, a cancelled
        # drive) still has its COMMIT or ROLLBACK run to the end before the lock is
        # let go (to_the_end): the next user of the connection starts clean.
        async with self._lock:
            try:
                await self._begin()
                yield self._statements
            except BaseException:
                await to_the_end(self._rollback())
                raise
            commit = asyncio.ensure_future(self._conn.execute("COMMIT"))
            try:
                await to_the_end(commit)
            except BaseException:
                if commit.cancelled() or commit.exception() is not None:
                    # A failed COMMIT leaves the transaction open.
                    await to_the_end(self._rollback())
                elif on_commit is not None:  # committed, the caller cancelled meanwhile
                    on_commit()
                raise
        if on_commit is not None:
            on_commit()

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[_DirectTx | _ThreadTx]:
        # No BEGIN: a lone SELECT is its own read transaction and does not take the
        # write lock the checkpointer's connection needs. The lock still keeps it out
        # of another coroutine's open transaction on this connection.
        async with self._lock:
            yield self._statements

    @asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[_DirectTx | _ThreadTx]:
        # A deferred BEGIN takes no lock: WAL gives its first SELECT a snapshot that
        # later commits (the checkpointer's, an admin command's) do not change.
        async with self._lock:
            try:
                # (Inside the try: on aiosqlite's thread a cancel may land as BEGIN
                # runs, and the next user of the connection must start clean.)
                await self._statements.execute("BEGIN")
                yield self._statements
            finally:
                await to_the_end(self._rollback())  # nothing was written: no fsync

    async def _begin(self) -> None:
        statements = self._statements
        if not (isinstance(statements, _DirectTx) and statements.try_begin()):
            await self._conn.execute("BEGIN IMMEDIATE")

    async def _rollback(self) -> None:
        try:
            await self._conn.execute("ROLLBACK")
        except sqlite3.OperationalError:
            pass  # BEGIN never ran, or SQLite already rolled back

    async def ping(self) -> None:
        async with self._lock:
            await self._conn.execute("SELECT 1")

    async def close(self) -> None:
        await self._conn.close()
