"""Open the run store, LangGraph's checkpointer and its store on one database URL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass
from pathlib import Path

import aiosqlite
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.store.base import BaseStore
from langgraph.store.postgres.aio import AsyncPostgresStore
from langgraph.store.sqlite.aio import AsyncSqliteStore

from runtime.checkpointer import PooledPostgresSaver
from runtime.dberrors import DATABASE_ERRORS, unavailable
from runtime.store.base import RunStore
from runtime.store.postgres import (
    CHECKPOINTER_SETUP_LOCK,
    PostgresRunStore,
    SessionPool,
    advisory_lock,
    open_pool,
)
from runtime.store.sqlite import SqliteRunStore, close_quietly

log = logging.getLogger(__name__)

CHECKPOINT_SERDE = JsonPlusSerializer(allowed_msgpack_modules=[("runtime.errors", "Code")])
"""LangGraph's serde, with the one type of ours that checkpoints hold: a failed outcome's
``Code``, as versions before its code was a plain str wrote it (runtime.state.failed).
Unlisted, LangGraph revives it with a warning that a future version will not, and under
LANGGRAPH_STRICT_MSGPACK not at all (langgraph-checkpoint 4.3, serde/jsonplus.py's
_create_msgpack_ext_hook). A list makes every other type not LangGraph's own
unrevived: the state holds JSON values only (tests/api/test_checkpoint_values.py)."""


@dataclass
class Backend:
    store: RunStore
    checkpointer: BaseCheckpointSaver[str]
    memory: BaseStore
    """LangGraph's store: users' long-term memory (runtime.memory)."""
    close: Callable[[], Awaitable[None]]
    sessions: Container[int] = frozenset()
    """PostgreSQL backend pids of this process's sessions: a NOTIFY from one of them is
    a commit of ours, which the store has announced in process already."""


def sqlite_path(url: str) -> Path:
    if not url.startswith("sqlite:///"):
        raise ValueError(f"not a sqlite URL: {url}")
    return Path(url.removeprefix("sqlite:///"))


async def open_backend(url: str, pool_size: int = 10) -> Backend:
    """``sqlite:///path/file.db`` or ``postgresql://…``; both stores live in that database
    (on PostgreSQL, one pool of at most ``pool_size`` connections for all three)."""
    if url.startswith("sqlite:///"):
        path = sqlite_path(url)
        store = await SqliteRunStore.open(path)
        conns: list[aiosqlite.Connection] = []
        try:
            conn = await aiosqlite.connect(path)
            conns.append(conn)
            await conn.execute("PRAGMA busy_timeout=10000")
            saver = AsyncSqliteSaver(conn, serde=CHECKPOINT_SERDE)
            await saver.setup()
            # Its own connection: it commits under its own lock, like the saver.
            memory_conn = await aiosqlite.connect(path, isolation_level=None)
            conns.append(memory_conn)
            await memory_conn.execute("PRAGMA busy_timeout=10000")
            memory = AsyncSqliteStore(memory_conn)
            await memory.setup()
        except BaseException:  # their threads would keep a process that failed alive
            for opened in conns:
                await close_quietly(opened)
            await store.close()
            raise

        async def close_sqlite() -> None:
            await memory_conn.close()
            await conn.close()
            await store.close()

        return Backend(store, saver, memory, close_sqlite)
    if url.startswith(("postgresql://", "postgres://")):
        pool = await open_pool(url, max_size=pool_size)
        try:
            pg_store, pg_saver, pg_memory = await _set_up_through_a_failover(pool)
        except BaseException:  # a migration refused, say: the pool's connections too
            await pool.close()
            raise
        return Backend(pg_store, pg_saver, pg_memory, pg_store.close, pool.sessions)
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///… or postgresql://…")


SET_UP_WITHIN_S = 30.0
"""How long a process starting on PostgreSQL tries its schema set-up again while the
database is away or refuses writes (a failover's promoted standby, read-only for a
moment): the set-up writes even where the schema is current (``CREATE TABLE IF NOT
EXISTS`` is refused in a read-only transaction), and a worker a supervisor restarted
then crashed, again and again, for as long as the failover lasted."""


async def _set_up_through_a_failover(
    pool: SessionPool,
) -> tuple[PostgresRunStore, PooledPostgresSaver, AsyncPostgresStore]:
    loop = asyncio.get_running_loop()
    until = loop.time() + SET_UP_WITHIN_S
    delay = 0.1
    while True:
        try:
            store = await PostgresRunStore.open(pool)
            saver = PooledPostgresSaver(pool, serde=CHECKPOINT_SERDE)  # type: ignore[arg-type]
            memory = AsyncPostgresStore(pool)  # type: ignore[arg-type]
            async with advisory_lock(pool, CHECKPOINTER_SETUP_LOCK):
                await saver.setup()
                await memory.setup()
            return store, saver, memory
        except DATABASE_ERRORS as exc:
            if not unavailable(exc) or loop.time() + delay > until:
                raise
            log.warning("the database cannot take the schema set-up yet (%s); trying again", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def settle_checkpointer(saver: BaseCheckpointSaver[str]) -> None:
    """End a transaction that a checkpoint write cut short left open.

    AsyncSqliteSaver writes and commits under its lock; a drive cancelled (or failing)
    between the two leaves its connection, shared by every drive of the process, inside
    a transaction that holds SQLite's write lock, and every later write waits on it.
    Rolling back is what a crash at that point would do. Under the saver's lock no other
    write is between its statement and its commit; aiosqlite runs the rollback after
    the cut-short statement.
    """
    if isinstance(saver, AsyncSqliteSaver):
        async with saver.lock:
            await saver.conn.rollback()
