"""What a database (ours, or a driver's) raises, and how a tool learns ours failed it."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator

import psycopg
import psycopg_pool
from langgraph.store.base import BaseStore, Op, Result


class ServiceUnavailable(Exception):
    """The runtime's own database could not serve a tool's request (an artifact it
    wrote, its user's memory): not the tool's failure, nor one that lasts. It goes
    through the handler's error handling untouched and fails the drive, which is handed
    back, as a crash mid-call would be; a tool's own database raising the same error is
    the tool's failure (``TOOL_FAILED``), as before. Not an ``OSError``: a tool that
    turns its network errors into ``ToolUnavailable`` must not take ours for one."""


TRANSIENT_DB_ERRORS = (
    psycopg.OperationalError,
    psycopg.errors.ReadOnlySqlTransaction,
    sqlite3.OperationalError,
    OSError,
    ServiceUnavailable,
)
"""What a database that is away, or refusing writes for now, raises: a failover's
promoted standby refuses them as a read-only transaction (an ``InternalError`` to
psycopg), which failed a drive's run INTERNAL_ERROR and ended the heartbeat."""
DATABASE_ERRORS = (psycopg.Error, sqlite3.Error, OSError, ServiceUnavailable)
"""Whatever a database or its driver raises: a failure to record that may be the
connection's (a failover's read-only transaction, a broken pooled connection), not the
run's rows, so it is never taken for one that lasts."""

_PASSING_SQLSTATES = ("08", "25006", "40", "53", "57", "58", "55P03")
"""Connection exceptions, a read-only transaction (a failover's), transaction rollbacks
(deadlocks, serialisation), insufficient resources, operator intervention (a shutdown),
system errors (I/O), a lock not available."""

_CONNECTION_LOST = ("connection", "server closed", "terminat", "timeout", "ssl", "eof")
"""How libpq and psycopg say a connection went (as against, say, "number of parameters
must be between 0 and 65535", refused before anything was sent)."""


def unavailable(exc: BaseException) -> bool:
    """Whether a database error says the database cannot serve now, not that the request
    or the code is wrong: SQLite's OperationalError also means bad SQL, PostgreSQL's
    also a limit exceeded; only what passes is worth a retry."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(w in text for w in ("locked", "disk", "unable to open"))
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed | OSError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    sqlstate = exc.sqlstate
    if sqlstate is None:  # no answer from the server: the connection, or the client refused
        text = str(exc).lower()
        return any(w in text for w in _CONNECTION_LOST)
    return sqlstate.startswith(_PASSING_SQLSTATES)


@contextlib.contextmanager
def serving(what: str) -> Iterator[None]:
    """Around the runtime's own store serving a tool: its database unavailable is
    :class:`ServiceUnavailable`; any other error (the request itself refused) stays
    what it is, the tool's to handle or fail on."""
    try:
        yield
    except DATABASE_ERRORS as exc:
        if not unavailable(exc):
            raise
        raise ServiceUnavailable(f"{what}: {exc}") from exc


class ServiceStore(BaseStore):
    """LangGraph's store as a tool reaches it: its transient errors are
    :class:`ServiceUnavailable` (every operation of a ``BaseStore`` goes through
    ``batch``/``abatch``)."""

    def __init__(self, store: BaseStore) -> None:
        self._store = store

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        with serving("memory store"):
            return self._store.batch(ops)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        with serving("memory store"):
            return await self._store.abatch(ops)
