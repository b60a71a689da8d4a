"""The production run store on PostgreSQL: psycopg 3 with a connection pool."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from runtime.store.base import Row, RunStore, Tx

log = logging.getLogger(__name__)

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


async def _configure(conn: AsyncConnection[DictRow]) -> None:
    # A process paused mid-transaction (SIGSTOP, a long GC) must not hold run rows
    # locked forever: PostgreSQL ends such a session, and the others move on.
    await conn.execute("SET idle_in_transaction_session_timeout = '60s'")


async def open_pool(url: str, max_size: int = 10) -> AsyncConnectionPool[AsyncConnection[DictRow]]:
    pool: AsyncConnectionPool[AsyncConnection[DictRow]] = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        kwargs=CONNECTION_KWARGS,
        open=False,
        connection_class=AsyncConnection[DictRow],
        configure=_configure,
    )
    await pool.open(wait=True, timeout=10)
    return pool


MIGRATION_LOCK = 724301
CHECKPOINTER_SETUP_LOCK = 724302


@asynccontextmanager
async def advisory_lock(
    pool: AsyncConnectionPool[AsyncConnection[DictRow]], key: int
) -> AsyncIterator[None]:
    """Serialise schema set-up across processes starting at once.

    Polls ``pg_try_advisory_lock`` rather than blocking in ``pg_advisory_lock``:
    a blocked call is an open transaction, and LangGraph's ``CREATE INDEX
    CONCURRENTLY`` in the lock holder would wait for it forever (an undetected
    deadlock between two starting processes).
    """
    async with pool.connection() as conn:
        delay = 0.01
        while True:
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s) AS got", (key,))
            row = await cur.fetchone()
            if row and row["got"]:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)
        try:
            yield
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


class PostgresRunStore(RunStore):
    dialect = "postgres"
    blob_type = "BYTEA"
    for_update = " FOR UPDATE"
    skip_locked = " FOR UPDATE SKIP LOCKED"
    now_sql = "EXTRACT(EPOCH FROM clock_timestamp())"

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[DictRow]]) -> None:
        super().__init__()
        self.pool = pool

    @classmethod
    async def open(cls, pool: AsyncConnectionPool[AsyncConnection[DictRow]]) -> PostgresRunStore:
        store = cls(pool)
        async with advisory_lock(pool, MIGRATION_LOCK):
            await store.migrate()
        return store

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[_PgTx]:
        async with self.pool.connection() as conn, conn.transaction():
            yield _PgTx(conn)

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[_PgTx]:
        # Autocommit: one SELECT is one round trip, without BEGIN and COMMIT around it.
        async with self.pool.connection() as conn:
            yield _PgTx(conn)

    async def _announce(self, tx: Tx, channel: str, payload: str) -> None:
        await tx.execute("SELECT pg_notify(?, ?)", (channel, payload))

    async def ping(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute("SELECT 1")

    async def close(self) -> None:
        await self.pool.close()


Handler = Callable[[str], None]


async def listen(url: str, handlers: Mapping[str, Handler]) -> None:
    """LISTEN on each channel and call its handler with every payload, forever.

    Runs on its own connection (a pooled one would be handed to others between
    notifications) and reconnects after the database comes back.
    """
    delay = 0.2
    while True:
        try:
            conn = await AsyncConnection.connect(url, autocommit=True)
            async with conn:
                for channel in handlers:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                delay = 0.2
                # Something may have happened while we were not listening.
                for handler in handlers.values():
                    handler("")
                async for notice in conn.notifies():
                    on_notice = handlers.get(notice.channel)
                    if on_notice is not None:
                        on_notice(notice.payload)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("LISTEN connection lost; reconnecting in %.1fs", delay, exc_info=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
