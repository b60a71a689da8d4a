"""The production run store on PostgreSQL: psycopg 3 with a connection pool."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from runtime.store.base import Row, RunStore

# The settings LangGraph's PostgresSaver requires; the run store shares the pool.
CONNECTION_KWARGS: dict[str, Any] = {
    "autocommit": True,
    "row_factory": dict_row,
    "prepare_threshold": 0,
}


def _pg(sql: str) -> str:
    return sql.replace("?", "%s")


class _PgTx:
    def __init__(self, conn: AsyncConnection[DictRow]) -> None:
        self._conn = conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        await self._conn.execute(_pg(sql), tuple(params))

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        cur = await self._conn.execute(_pg(sql), tuple(params))
        return await cur.fetchone()

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = await self._conn.execute(_pg(sql), tuple(params))
        return await cur.fetchall()


async def open_pool(url: str, max_size: int = 10) -> AsyncConnectionPool[AsyncConnection[DictRow]]:
    pool: AsyncConnectionPool[AsyncConnection[DictRow]] = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        kwargs=CONNECTION_KWARGS,
        open=False,
        connection_class=AsyncConnection[DictRow],
    )
    await pool.open(wait=True, timeout=10)
    return pool


class PostgresRunStore(RunStore):
    dialect = "postgres"
    blob_type = "BYTEA"
    for_update = " FOR UPDATE"

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[DictRow]]) -> None:
        super().__init__()
        self.pool = pool

    @classmethod
    async def open(cls, pool: AsyncConnectionPool[AsyncConnection[DictRow]]) -> PostgresRunStore:
        store = cls(pool)
        async with pool.connection() as conn:
            # Serialise concurrent migrations from several processes starting at once.
            await conn.execute("SELECT pg_advisory_lock(724301)")
            try:
                await store.migrate()
            finally:
                await conn.execute("SELECT pg_advisory_unlock(724301)")
        return store

    @asynccontextmanager
    async def tx(self) -> AsyncIterator[_PgTx]:
        async with self.pool.connection() as conn, conn.transaction():
            yield _PgTx(conn)

    async def ping(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute("SELECT 1")

    async def close(self) -> None:
        await self.pool.close()
