"""The embedded run store: one SQLite file, one connection, transactions serialised in-process."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from runtime.store.base import Row, RunStore


class _SqliteTx:
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


class SqliteRunStore(RunStore):
    dialect = "sqlite"
    blob_type = "BLOB"
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, conn: aiosqlite.Connection) -> None:
        super().__init__()
        self._conn = conn
        # One connection: transactions must not interleave on it.
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path) -> SqliteRunStore:
        # In a thread: a LangGraph server refuses blocking calls inside a run.
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        conn = await aiosqlite.connect(path, isolation_level=None)
        conn.row_factory = aiosqlite.Row
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA busy_timeout=10000")
        # FULL, not NORMAL: in WAL mode NORMAL skips the fsync at commit, so a power
        # loss can roll back commits that were already acted on (a ledger row claimed
        # before its side effect ran would vanish, and the effect would run again).
        # The cost is one fsync per transaction, which is why the store batches writes.
        await conn.execute("PRAGMA synchronous=FULL")
        store = cls(conn)
        await store.migrate()
        return store

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[_SqliteTx]:
        # aiosqlite runs statements in order on its own thread, so a shielded
        # COMMIT/ROLLBACK still lands before the next BEGIN even when the caller
        # is cancelled (an SSE client hanging up) in the middle of a transaction.
        async with self._lock:
            try:
                await self._conn.execute("BEGIN IMMEDIATE")
                yield _SqliteTx(self._conn)
            except BaseException:
                await asyncio.shield(self._rollback())
                raise
            try:
                await asyncio.shield(self._conn.execute("COMMIT"))
            except sqlite3.OperationalError:
                await asyncio.shield(self._rollback())
                raise

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[_SqliteTx]:
        # No BEGIN: a lone SELECT is its own read transaction and does not take the
        # write lock the checkpointer's connection needs. The lock still keeps it out
        # of another coroutine's open transaction on this connection.
        async with self._lock:
            yield _SqliteTx(self._conn)

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
