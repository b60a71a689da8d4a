"""A writing transaction of the run store, and the lease fence it checks.

The fence is what keeps a worker that lost its lease (paused, partitioned) from
writing over the run's new owner: every writing transaction of a drive checks
that the run's ``lease_version`` is still the one it was given.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

Row = dict[str, Any]


class Tx(Protocol):
    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...
    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None: ...
    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...


class LeaseLost(Exception):
    """This worker's lease on the run was taken over: it must stop writing to the run."""


FenceCheck = Callable[[Tx, str, int], Awaitable[None]]
"""(transaction, run_id, lease_version): raises :class:`LeaseLost` unless it is held,
and locks the run row until the transaction ends."""


def _plain_read(sql: str) -> bool:
    head = sql.lstrip()[:6].upper()
    return head == "SELECT" and "FOR UPDATE" not in sql.upper()


class StoreTx:
    """One writing transaction of the store, around the dialect's connection.

    The lease fence is checked lazily, just before the first statement that
    writes or locks (so a transaction that turns out to only read pays nothing),
    or folded into the statement that locks the run row (``StoreCore._lock_run``).
    Either way the run row stays locked from the check to the commit, so a
    takeover cannot slip in between. Events appended here are announced once per
    run, with the last seq, when the transaction ends.
    """

    def __init__(self, inner: Tx, fence: tuple[str, int] | None, check: FenceCheck) -> None:
        self.inner = inner
        self.fence = fence
        self._check = check
        self.appended: dict[str, int] = {}
        """The last seq appended, per run."""
        self.announced: dict[str, int] = {}
        """Runs whose last appended seq a statement of this transaction already announced."""
        self.rows: dict[str, list[Row]] = {}
        """The event rows appended, per run, as they are stored."""

    def take_fence(self, run_id: str) -> int | None:
        """The fencing token, if it is still to be checked and is on ``run_id``: the
        caller checks it in its own statement on the run row."""
        if self.fence is None or self.fence[0] != run_id:
            return None
        version = self.fence[1]
        self.fence = None
        return version

    async def _guard(self, sql: str) -> None:
        if self.fence is not None and not _plain_read(sql):
            fence, self.fence = self.fence, None
            await self._check(self.inner, *fence)

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        await self._guard(sql)
        await self.inner.execute(sql, params)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        await self._guard(sql)
        return await self.inner.fetchone(sql, params)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        await self._guard(sql)
        return await self.inner.fetchall(sql, params)
