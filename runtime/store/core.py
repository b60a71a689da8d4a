"""The store's core: transactions, the event log and run transitions.

Every change that an event describes is written in the same transaction as the
event; every transition goes through the lifecycle table here.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Self

from runtime.errors import Code, RuntimeProblem
from runtime.events import EventType
from runtime.lifecycle import TERMINAL, State, Trigger, transition
from runtime.model import utcnow
from runtime.store.codec import _enc, _enc_col, _ts, event_row
from runtime.store.journal import Journal, PendingTransition
from runtime.store.schema import ADDED_COLUMN, MIGRATIONS, check_schema_version
from runtime.store.tx import LeaseLost, Row, StoreTx, Tx

EventListener = Callable[[str, int, Sequence[Row]], None]
"""(run_id, last seq committed, the committed event rows of that run, as stored)."""


EVENTS_CHANNEL = "agent_runtime_events"
"""NOTIFY payload '<run_id> <seq>': an event was committed."""
WORK_CHANNEL = "agent_runtime_work"
"""NOTIFY payload '<run_id>': a run needs a worker."""
CANCEL_CHANNEL = "agent_runtime_cancel"
"""NOTIFY payload '<run_id>': whoever drives the run must stop it."""


ENDED = "state IN ({})".format(", ".join(f"'{state.value}'" for state in sorted(TERMINAL)))
"""SQL: the run has ended (its state is terminal)."""

ENDED_LEASE: dict[str, Any] = {
    "lease_owner": None,
    "lease_expires_at": None,
    "drive_failures": 0,
    "takeovers": 0,
}
"""The lease columns of a run that has ended: released (its version stays, for the
drive that ended it to tell its lease from a takeover)."""


def _transition_changes(
    current: State,
    target: State,
    trigger: Trigger,
    events: Sequence[tuple[EventType, dict[str, Any]]],
    fields: dict[str, Any],
) -> tuple[dict[str, Any], list[tuple[EventType, dict[str, Any]]]]:
    """The run columns a transition writes and the events it appends, state event last."""
    if target in (State.SUCCEEDED, State.FAILED):
        # An ended run is nobody's: its lease goes with the end, as a release would let
        # it go, so a worker killed between the two leaves no owner on a finished run.
        fields = {**fields, "ended_at": utcnow(), "needs_drive": 0, **ENDED_LEASE}
    elif target is State.WAITING_HUMAN:
        # Parked: nothing to drive until a human decides (decide_approval sets it again).
        fields = {**fields, "needs_drive": 0}
    if current is State.WAITING_HUMAN and target is not State.WAITING_HUMAN:
        # Whatever moved it on (a decision, a cancel), what it waited for is not pending
        # any more: a run replanning after a rejection showed the decided approval.
        fields = {"pending_approval": None, **fields}
    state_event = {"from": current.value, "to": target.value, "trigger": trigger.value}
    return (
        {**fields, "state": target, "updated_at": _ts()},
        [*events, (EventType.STATE, state_event)],
    )


class StoreCore(ABC):
    """What every part of the store shares. Dialects provide :meth:`_tx` and :meth:`_read`."""

    dialect: str
    blob_type: str
    for_update: str = ""
    now_sql: str
    skip_locked: str = ""
    row_locks: bool = False
    """Whether the dialect locks rows (``skip_locked``) and joins LATERAL subqueries:
    PostgreSQL; SQLite serialises its writers instead."""
    notify_sql: str | None = None
    """A SELECT announcing (channel, payload) that can follow a CTE, where the dialect has one."""

    def __init__(self) -> None:
        self._listeners: list[EventListener] = []
        self._fence: tuple[str, int] | None = None
        self._journal: Journal | None = None

    def index_hint(self, index: str) -> str:
        """What follows a table's name to make the planner read it by ``index``, where
        the dialect takes hints (SQLite's planner, without statistics, would otherwise
        sort every waiting run to find the first)."""
        return ""

    # -- plumbing -------------------------------------------------------------

    @abstractmethod
    def _tx(self, on_commit: Callable[[], None] | None = None) -> AbstractAsyncContextManager[Tx]:
        """A transaction that commits on success and rolls back on error; ``on_commit``
        is called once it has committed, a cancel that lands as it commits included,
        where the dialect can tell."""

    @abstractmethod
    def _read(self) -> AbstractAsyncContextManager[Tx]:
        """A connection for single-statement reads: no transaction block, no fence."""

    @abstractmethod
    def _snapshot(self) -> AbstractAsyncContextManager[Tx]:
        """A read-only transaction: its statements see the database at one instant."""

    @asynccontextmanager
    async def tx(self) -> AsyncIterator[StoreTx]:
        """A writing transaction; on a drive's view it first writes the deferred state
        changes (:mod:`runtime.store.journal`), in the same commit."""
        tx: StoreTx | None = None

        def committed() -> None:
            if tx is not None:
                self._notify(tx.appended, tx.rows)

        async with self._ordered() as pending, self._tx(committed) as inner:
            tx = StoreTx(inner, self._fence, self._check_fence)
            for change in pending:
                await self._write_deferred(tx, change)
            yield tx
            for run_id, seq in tx.appended.items():
                if tx.announced.get(run_id, 0) < seq:
                    await self._announce(inner, EVENTS_CHANNEL, f"{run_id} {seq}")

    @asynccontextmanager
    async def _ordered(self) -> AsyncIterator[list[PendingTransition]]:
        """The deferred state changes a write must carry ([] on most views), in order."""
        journal = self._journal
        if journal is None or not journal.busy():
            yield []
            return
        async with journal.ordered() as pending:
            yield pending

    async def _write_deferred(self, tx: StoreTx, change: PendingTransition) -> None:
        # A run already in the target state: committed by a write cancelled as it committed.
        await self._transition(
            tx,
            change.run_id,
            change.trigger,
            change.expect,
            (),
            change.fields,
            done_in=change.target,
            to=change.to,
            at=change.at,
        )

    def defer_transition(
        self,
        run_id: str,
        trigger: Trigger,
        *,
        expect: State,
        to: State | None = None,
        **fields: Any,
    ) -> State | None:
        """Queue ``trigger`` to be written with the view's next write; the state it
        will reach, or None where nothing defers (a view that is not a drive's)."""
        if self._journal is None or self._fence is None or self._fence[0] != run_id:
            return None
        change = PendingTransition(run_id, trigger, expect, fields, to)
        self._journal.add(change)
        return change.target

    async def flush(self) -> None:
        """Write the deferred state changes now, if there are any."""
        if self._journal is not None and self._journal.busy():
            async with self.tx():
                pass

    def close_journal(self) -> None:
        if self._journal is not None:
            self._journal.close()

    def _single(self) -> AbstractAsyncContextManager[Tx]:
        """Where one writing statement commits by itself; a transaction by default."""
        return self._tx()

    async def write_once(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One writing statement, atomic by itself, without the lease fence: for lease
        bookkeeping, whose statements state their own conditions (owner, version)."""
        async with self._single() as conn:
            return await conn.fetchall(sql, params)

    @asynccontextmanager
    async def read(self, *, runs: bool = True) -> AsyncIterator[Tx]:
        """For methods that run one SELECT: a worker that lost its lease may still read
        (what it reads cannot harm anyone: every write of it is fenced), and a single
        statement is consistent by itself.

        ``runs``: whether the read looks at the runs or events tables, which a drive's
        deferred state changes are written to first (so that it reads its own writes)."""
        if runs:
            await self.flush()
        async with self._read() as conn:
            yield conn

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[Tx]:
        """For several SELECTs that must agree with each other (a run and its steps,
        ledger and log, read while it moves on): one read-only transaction."""
        await self.flush()
        async with self._snapshot() as conn:
            yield conn

    def fenced(self, run_id: str, lease_version: int) -> Self:
        """A view of this store whose every writing transaction checks the run's lease.

        A worker that lost its lease (paused, partitioned) gets :class:`LeaseLost`
        instead of writing over the new owner; the check locks the run row, so it
        holds until the transaction commits.
        """
        view = copy.copy(self)
        view._fence = (run_id, lease_version)
        view._journal = Journal(view.flush)
        return view

    async def _check_fence(self, tx: Tx, run_id: str, lease_version: int) -> None:
        row = await tx.fetchone(
            f"SELECT lease_version FROM runs WHERE run_id = ?{self.for_update}", (run_id,)
        )
        if row is None or int(row["lease_version"]) != lease_version:
            raise LeaseLost(f"lease {lease_version} on {run_id} is no longer held")

    async def _lock_key(self, tx: Tx, key: str) -> None:  # noqa: B027
        """Serialise transactions that check-then-insert on ``key``, until commit.

        SQLite's BEGIN IMMEDIATE already serialises every writer; PostgreSQL overrides.
        """

    async def _lock_run(self, tx: StoreTx, run_id: str, columns: str) -> Row | None:
        """Lock the run row and read ``columns``, checking the fence in the same statement."""
        version = tx.take_fence(run_id)
        row = await tx.fetchone(
            f"SELECT {columns}, lease_version FROM runs WHERE run_id = ?{self.for_update}",
            (run_id,),
        )
        if version is not None and (row is None or int(row["lease_version"]) != version):
            raise LeaseLost(f"lease {version} on {run_id} is no longer held")
        return row

    async def _transition_at_once(
        self,
        run_id: str,
        trigger: Trigger,
        expect: State,
        events: Sequence[tuple[EventType, dict[str, Any]]],
        fields: dict[str, Any],
        to: State | None = None,
    ) -> Row | None:
        """A transition from ``expect`` as one atomic statement, where the dialect can.

        None: not done (unsupported, or the run is not in ``expect``, or the lease is
        not ours); the caller takes the locking path, which says why.
        """
        return None

    async def _announce(self, tx: Tx, channel: str, payload: str) -> None:  # noqa: B027
        """Tell other processes, on commit (PostgreSQL NOTIFY); in-process only by default."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def ping(self) -> None: ...

    def add_listener(self, listener: EventListener) -> None:
        """Called with (run_id, last seq) after a transaction that appended events commits."""
        self._listeners.append(listener)

    async def migrate(self) -> None:
        async with self.tx() as tx:
            await tx.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = await tx.fetchone("SELECT MAX(version) AS v FROM schema_version")
            current = (row or {}).get("v") or 0
            check_schema_version(current)
            for version, statements in enumerate(MIGRATIONS, start=1):
                if version <= current:
                    continue
                for sql in statements:
                    added = ADDED_COLUMN.fullmatch(sql)
                    if added is not None and await self._has_column(tx, *added.groups()):
                        continue
                    await tx.execute(sql.format(blob=self.blob_type))
                await tx.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))

    async def _has_column(self, tx: StoreTx, table: str, column: str) -> bool:
        if self.dialect == "sqlite":
            sql = "SELECT 1 AS one FROM pragma_table_info(?) WHERE name = ?"
        else:
            sql = (
                "SELECT 1 AS one FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = ? AND column_name = ?"
            )
        return await tx.fetchone(sql, (table, column)) is not None

    def _notify(self, appended: dict[str, int], rows: dict[str, list[Row]]) -> None:
        """After a commit: tell the listeners each run's last seq and its new event rows."""
        for run_id, seq in appended.items():
            for listener in self._listeners:
                listener(run_id, seq, rows.get(run_id, ()))

    async def _append(
        self,
        tx: StoreTx,
        run_id: str,
        type_: EventType,
        data: dict[str, Any],
        dedupe_key: str | None = None,
    ) -> int | None:
        """Append one event; with ``dedupe_key``, only if no event of the run has that key."""
        if dedupe_key is not None:
            seen = await tx.fetchone(
                "SELECT seq FROM events WHERE run_id = ? AND dedupe_key = ?", (run_id, dedupe_key)
            )
            if seen is not None:
                return None
        # The update locks the run row, so it can check the fence too, as _lock_run does.
        version = tx.take_fence(run_id)
        row = await tx.fetchone(
            "UPDATE runs SET last_seq = last_seq + 1 WHERE run_id = ? "
            "RETURNING last_seq, lease_version",
            (run_id,),
        )
        if version is not None and (row is None or int(row["lease_version"]) != version):
            raise LeaseLost(f"lease {version} on {run_id} is no longer held")
        if row is None:
            raise RuntimeProblem(Code.RUN_NOT_FOUND, f"run {run_id} not found")
        seq = int(row["last_seq"])
        await self._insert_events(tx, run_id, seq, [(type_, data)], dedupe_key)
        return seq

    async def _insert_events(
        self,
        tx: StoreTx,
        run_id: str,
        last_seq: int,
        events: Sequence[tuple[EventType, dict[str, Any]]],
        dedupe_key: str | None = None,
        ts: str | None = None,
    ) -> None:
        """Insert ``events`` as the run's seqs up to ``last_seq`` (already counted in runs),
        stamped ``ts`` (now by default)."""
        first = last_seq - len(events) + 1
        ts = ts or _ts()
        params: list[Any] = []
        rows = tx.rows.setdefault(run_id, [])
        for offset, (type_, data) in enumerate(events):
            row = event_row(run_id, first + offset, type_.value, ts, _enc(data))
            rows.append(row)
            params += [*row.values(), dedupe_key]
        marks = ", ".join("(?, ?, ?, ?, ?, ?)" for _ in events)
        insert = f"INSERT INTO events (run_id, seq, type, ts, data, dedupe_key) VALUES {marks}"
        if self.notify_sql is not None:
            # NOTIFY is delivered at commit whenever it is sent: with the insert, it
            # costs no round trip of its own.
            await tx.execute(
                f"WITH ins AS ({insert}) {self.notify_sql}",
                [*params, EVENTS_CHANNEL, f"{run_id} {last_seq}"],
            )
            tx.announced[run_id] = max(last_seq, tx.announced.get(run_id, 0))
        else:
            await tx.execute(insert, params)
        tx.appended[run_id] = max(last_seq, tx.appended.get(run_id, 0))

    async def _insert_once(
        self, tx: Tx, table: str, key: str, data: dict[str, Any], returning: str | None = None
    ) -> Row | None:
        """Insert a row unless its key exists; the inserted row's ``returning`` columns
        (its key by default), or None if it existed.

        ON CONFLICT makes a concurrent duplicate wait for the first and then do
        nothing, instead of failing on the unique key.
        """
        cols = list(data)
        return await tx.fetchone(
            f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
            f"ON CONFLICT DO NOTHING RETURNING {returning or key}",
            [_enc_col(c, data[c]) for c in cols],
        )

    async def _update_run(self, tx: Tx, run_id: str, **fields: Any) -> None:
        fields["updated_at"] = _ts()
        sets = ", ".join(f"{k} = ?" for k in fields)
        await tx.execute(
            f"UPDATE runs SET {sets} WHERE run_id = ?",
            [*(_enc_col(k, v) for k, v in fields.items()), run_id],
        )

    async def _transition(
        self,
        tx: StoreTx,
        run_id: str,
        trigger: Trigger,
        expect: State | None,
        events: Sequence[tuple[EventType, dict[str, Any]]],
        fields: dict[str, Any],
        done_in: State | None = None,
        to: State | None = None,
        at: str | None = None,
    ) -> Row:
        """Fire ``trigger``: one locked read of the run, one update that also counts the
        events' seqs and returns the new row, one insert of the events (stamped ``at``,
        now by default). A run found in ``done_in``, or past it in a terminal state, is
        left as it is."""
        row = await self._lock_run(tx, run_id, "state")
        if row is None:
            raise RuntimeProblem(Code.RUN_NOT_FOUND, f"run {run_id} not found")
        current = State(row["state"])
        if done_in is not None and (current is done_in or current in TERMINAL):
            return row
        if expect is not None and current is not expect:
            raise RuntimeProblem(
                Code.RUN_STATE_CONFLICT, f"run is {current.value}, not {expect.value}"
            )
        target = transition(current, trigger, to)
        fields, all_events = _transition_changes(current, target, trigger, events, fields)
        sets = ", ".join(f"{k} = ?" for k in fields)
        updated = await tx.fetchone(
            f"UPDATE runs SET {sets}, last_seq = last_seq + ? WHERE run_id = ? RETURNING *",
            [*(_enc_col(k, v) for k, v in fields.items()), len(all_events), run_id],
        )
        assert updated is not None, "the run row is locked"
        await self._insert_events(tx, run_id, int(updated["last_seq"]), all_events, ts=at)
        return updated
