"""What a database (ours, or a driver's) raises, and how a tool learns ours failed it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

import psycopg
from langgraph.store.base import BaseStore, Op, Result

TRANSIENT_DB_ERRORS = (psycopg.OperationalError, sqlite3.OperationalError, OSError)
"""What a database that is away, or refusing writes for now, raises."""
DATABASE_ERRORS = (psycopg.Error, sqlite3.Error, OSError)
"""Whatever a database or its driver raises: a failure to record that may be the
connection's (a failover's read-only transaction, a broken pooled connection), not the
run's rows, so it is never taken for one that lasts."""


class ServiceUnavailable(ConnectionError):
    """The runtime's own database failed a tool's request (an artifact it wrote, its
    user's memory): not the tool's failure, nor one that lasts. It goes through the
    handler's error handling untouched and fails the drive, which is handed back, as a
    crash mid-call would be; a tool's own database raising the same error is the tool's
    failure (``TOOL_FAILED``), as before."""


class ServiceStore(BaseStore):
    """LangGraph's store as a tool reaches it: its transient errors are
    :class:`ServiceUnavailable` (every operation of a ``BaseStore`` goes through
    ``batch``/``abatch``)."""

    def __init__(self, store: BaseStore) -> None:
        self._store = store

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        try:
            return self._store.batch(ops)
        except TRANSIENT_DB_ERRORS as exc:
            raise ServiceUnavailable(f"memory store: {exc}") from exc

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        try:
            return await self._store.abatch(ops)
        except TRANSIENT_DB_ERRORS as exc:
            raise ServiceUnavailable(f"memory store: {exc}") from exc
