"""The production run store on PostgreSQL: psycopg 3 with a connection pool."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Collection, Container, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from runtime import failpoints
from runtime.errors import Code, RuntimeProblem
from runtime.events import EventType
from runtime.lifecycle import TERMINAL, State, Trigger, transition
from runtime.store.base import LeaseLost, Row, Tx
from runtime.store.codec import _enc, _enc_col, _ts, event_row
from runtime.store.core import EVENTS_CHANNEL, _transition_changes
from runtime.store.journal import PendingTransition
from runtime.store.pg_once import PgSingleStatements

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
    # locked forever: PostgreSQL ends such a session, and the others move on. Not one
    # paused in the middle of a pipeline: the server is still reading that statement
    # batch ("active"), where no timeout of PostgreSQL 15 applies (17's
    # transaction_timeout would): workers end those (FROZEN_SQL).
    # No JIT: ours are short statements, and a planner without fresh statistics (a
    # backlog that arrived in the last minute) priced a claim above jit_above_cost,
    # then spent 30 ms compiling a query that runs in one.
    # READ COMMITTED whatever the database's or role's default: a statement behind an
    # advisory lock (a tenant's cap) must see what the lock's last holder committed,
    # which a snapshot taken before the lock was granted does not. (Snapshots that
    # must be one instant ask for REPEATABLE READ themselves.)
    await conn.execute(
        "SELECT set_config('idle_in_transaction_session_timeout', '60s', false), "
        "set_config('jit', 'off', false), "
        "set_config('default_transaction_isolation', 'read committed', false)"
    )


APPLICATION_NAME = "agent-runtime"
"""Our sessions' name in ``pg_stat_activity`` where the URL gives none."""

FROZEN_SQL = (
    "SELECT a.pid, COALESCE(a.client_addr::text, 'local') AS client, "
    "EXTRACT(EPOCH FROM now() - a.xact_start)::float AS held_s, "
    "pg_terminate_backend(a.pid) AS ended "
    "FROM pg_stat_activity AS a "
    "WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() "
    "AND a.backend_type = 'client backend' "
    "AND a.state = 'active' AND a.wait_event = 'ClientRead' "
    "AND a.xact_start < now() - make_interval(secs => %s) "
    "AND pg_has_role(current_user, a.usesysid, 'USAGE') "
    "AND EXISTS (SELECT 1 FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation "
    "WHERE l.pid = a.pid AND l.granted "
    "AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()))"
)
"""Ends the sessions waiting for the rest of a statement batch in a transaction begun
``%s`` seconds ago or more, on our tables (a lock on a relation of our schema: whatever
their role or application name, and never another deployment's, in a schema of its
own): their process sent part of a pipeline (each pipelined statement runs as it
arrives, its locks held to the sync) and stopped there: paused, frozen with its VM,
cut off, or its host gone without a word. Such a session holds what it locked (a run
row) until TCP gives up, hours later or never: no worker can claim the run and a
cancel of it waits. (A live one that old, still sending, would be an artifact of many
megabytes on a link slow enough to take two leases, a minute by default: ended, its
write fails and is retried.) Only sessions this role may signal
(``pg_terminate_backend`` would fail the query)."""


class SessionPool(AsyncConnectionPool[AsyncConnection[DictRow]]):
    """The process's pool, knowing the server process id of every session it opened:
    a NOTIFY one of them sent is this process's own commit, come back."""

    def __init__(self, url: str, max_size: int) -> None:
        kwargs = dict(CONNECTION_KWARGS)
        if "application_name" not in conninfo_to_dict(url):
            kwargs["application_name"] = APPLICATION_NAME
        self.sessions: set[int] = set()
        """Backend pids of the sessions opened (closed ones stay: a pid reused by another
        process's session costs that one's notices a short delay here, nothing more)."""
        self.sweeping: asyncio.Task[None] | None = None
        """The check of the idle sessions that a broken one set off, while it runs."""
        super().__init__(
            url,
            min_size=1,
            max_size=max_size,
            kwargs=kwargs,
            open=False,
            connection_class=AsyncConnection[DictRow],
            configure=self._configure,
        )

    async def _configure(self, conn: AsyncConnection[DictRow]) -> None:
        await _configure(conn)
        self.sessions.add(conn.info.backend_pid)

    async def putconn(self, conn: AsyncConnection[DictRow]) -> None:
        broken = conn.broken
        await super().putconn(conn)
        if broken and self.sweeping is None and not self.closed:
            # A session that broke seldom broke alone (a restart, a failover ends them
            # all), and the pool finds the others only as each is next used: each would
            # fail one more statement (a drive, a request), and a run fails at its fifth
            # failed drive in a row. One check of the idle ones, for one broken.
            self.sweeping = asyncio.create_task(self._sweep())

    async def close(self, timeout: float = 5.0) -> None:  # noqa: ASYNC109 (psycopg_pool's)
        if self.sweeping is not None:
            self.sweeping.cancel()
        await super().close(timeout)

    async def _sweep(self) -> None:
        try:
            await self.check()
        except Exception:  # the pool closing meanwhile; the next broken one sweeps again
            log.debug("checking the pool's sessions failed", exc_info=True)
        finally:
            self.sweeping = None


async def open_pool(url: str, max_size: int = 10) -> SessionPool:
    pool = SessionPool(url, max_size)
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


class PostgresRunStore(PgSingleStatements):
    dialect = "postgres"
    blob_type = "BYTEA"
    for_update = " FOR UPDATE"
    skip_locked = " FOR UPDATE OF runs SKIP LOCKED"  # the claim joins runs to a ranking
    now_sql = "EXTRACT(EPOCH FROM clock_timestamp())"
    row_locks = True
    notify_sql = "SELECT pg_notify(?, ?)"

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[DictRow]]) -> None:
        super().__init__()
        self.pool = pool

    @classmethod
    async def open(cls, pool: AsyncConnectionPool[AsyncConnection[DictRow]]) -> PostgresRunStore:
        store = cls(pool)
        async with advisory_lock(pool, MIGRATION_LOCK):
            await store.migrate()
        return store

    async def end_frozen_sessions(self, older_than_s: float) -> list[Row]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(FROZEN_SQL, (older_than_s,))
            return await cur.fetchall()

    @asynccontextmanager
    async def _tx(self, on_commit: Callable[[], None] | None = None) -> AsyncIterator[_PgTx]:
        async with self.pool.connection() as conn, conn.transaction():
            yield _PgTx(conn)
        # A cancel as it commits does not tell: the NOTIFY sent with the events
        # reaches this process's listener too.
        if on_commit is not None:
            on_commit()

    def _single(self) -> AbstractAsyncContextManager[_PgTx]:
        # Autocommit: a lone statement is its own transaction, without BEGIN and COMMIT.
        return self._read()

    @asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[_PgTx]:
        async with self.pool.connection() as conn, conn.transaction():
            # (Autocommit connections: the transaction block is psycopg's BEGIN.)
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield _PgTx(conn)

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[_PgTx]:
        # Autocommit: one SELECT is one round trip, without BEGIN and COMMIT around it.
        async with self.pool.connection() as conn:
            yield _PgTx(conn)

    async def _transition_at_once(
        self,
        run_id: str,
        trigger: Trigger,
        expect: State,
        events: Sequence[tuple[EventType, dict[str, Any]]],
        fields: dict[str, Any],
        to: State | None = None,
    ) -> Row | None:
        # One statement in autocommit is atomic and holds the run row's lock until it
        # commits: the compare-and-set on state (and on the lease, for a fenced view),
        # the events' seqs, their insert and the NOTIFY in one round trip instead of
        # BEGIN, lock, update, insert, notify, COMMIT.
        if self._fence is not None and self._fence[0] != run_id:
            return None
        statement = self._transition_statement(run_id, trigger, expect, events, fields, to)
        return self._transition_done(run_id, await self._pipelined(*statement[:2]), statement[2])

    def _transition_statement(
        self,
        run_id: str,
        trigger: Trigger,
        expect: State,
        events: Sequence[tuple[EventType, dict[str, Any]]],
        fields: dict[str, Any],
        to: State | None = None,
        at: str | None = None,
    ) -> tuple[str, list[Any], list[tuple[str, str, str]]]:
        """(query, params, the events as stored) of a transition as one statement;
        ``at``: its events' time (now by default)."""
        target = transition(expect, trigger, to)
        fields, all_events = _transition_changes(expect, target, trigger, events, fields)
        sets = ", ".join(f"{k} = %s" for k in fields)
        params: list[Any] = [
            *(_enc_col(k, v) for k, v in fields.items()),
            len(all_events),
            run_id,
            expect.value,
        ]
        fence = ""
        if self._fence is not None:
            fence = " AND lease_version = %s"
            params.append(self._fence[1])
        params.append(len(all_events))
        ts = at or _ts()
        rows = []
        stored: list[tuple[str, str, str]] = []
        for ordinal, (type_, data) in enumerate(all_events, start=1):
            rows.append(f"({ordinal}, %s, %s, %s)")
            stored.append((type_.value, ts, _enc(data)))
            params += stored[-1]
        params.append(EVENTS_CHANNEL)
        query = (
            f"WITH r AS (UPDATE runs SET {sets}, last_seq = last_seq + %s "
            f"WHERE run_id = %s AND state = %s{fence} RETURNING *), "
            "e AS (INSERT INTO events (run_id, seq, type, ts, data) "
            "SELECT r.run_id, r.last_seq - %s + v.ord, v.type, v.ts, v.data "
            f"FROM r, (VALUES {', '.join(rows)}) AS v (ord, type, ts, data)) "
            "SELECT r.*, pg_notify(%s, r.run_id || ' ' || r.last_seq)::text AS _notified FROM r"
        )
        return query, params, stored

    def _transition_done(
        self, run_id: str, row: Row | None, stored: list[tuple[str, str, str]]
    ) -> Row | None:
        """Announce the events of a transition statement that changed ``row``."""
        if row is None:
            return None
        row.pop("_notified", None)
        last = int(row["last_seq"])
        first = last - len(stored) + 1
        self._notify(
            {run_id: last},
            {run_id: [event_row(run_id, first + i, *e) for i, e in enumerate(stored)]},
        )
        return row

    async def _pipelined(self, query: str, params: list[Any]) -> Row | None:
        """Run one statement; on a drive's view, the deferred state changes first.

        Pipelined in autocommit, the statements run in one implicit transaction
        (PostgreSQL commits at the pipeline's sync): one round trip, one commit.
        """
        async with self._ordered() as pending:
            statements = [
                self._transition_statement(
                    c.run_id, c.trigger, c.expect, (), c.fields, c.to, at=c.at
                )
                for c in pending
            ]
            async with self.pool.connection() as conn:
                if not statements:
                    cur = await conn.execute(query, params)
                    return await cur.fetchone()
                async with conn.pipeline():
                    earlier = [await conn.execute(q, p) for q, p, _ in statements]
                    failpoints.hit("freeze.pipeline")
                    cur = await conn.execute(query, params)
                changed = [await c.fetchone() for c in earlier]
                row = await cur.fetchone()
            for change, (_, _, stored), done in zip(pending, statements, changed, strict=True):
                if self._transition_done(change.run_id, done, stored) is None:
                    await self._explain_unchanged(change)
            return row

    async def _explain_unchanged(self, change: PendingTransition) -> None:
        """A deferred change's statement changed nothing: it was committed already by a
        write cancelled as it committed (fine; and so may the writes after it have been,
        up to the run's end), or the lease is gone (then the statement after it, fenced
        too, wrote nothing), or the state moved under a lease we hold: a bug, said loudly."""
        async with self._read() as tx:
            row = await tx.fetchone(
                "SELECT state, lease_version FROM runs WHERE run_id = ?", (change.run_id,)
            )
        if row is None:
            raise RuntimeProblem(Code.RUN_NOT_FOUND, f"run {change.run_id} not found")
        if self._fence is not None and int(row["lease_version"]) != self._fence[1]:
            raise LeaseLost(f"lease {self._fence[1]} on {change.run_id} is no longer held")
        if row["state"] != change.target.value and State(row["state"]) not in TERMINAL:
            raise RuntimeProblem(
                Code.RUN_STATE_CONFLICT, f"run is {row['state']}, not {change.expect.value}"
            )

    async def _announce(self, tx: Tx, channel: str, payload: str) -> None:
        await tx.execute("SELECT pg_notify(?, ?)", (channel, payload))

    async def _lock_key(self, tx: Tx, key: str) -> None:
        # READ COMMITTED lets two transactions count the same rows; the lock orders them.
        await tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (key,))

    async def ping(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute("SELECT 1")

    async def close(self) -> None:
        await self.pool.close()


Handler = Callable[[str], None]

ECHO_DELAY_S = 0.25
"""How late a notice sent by one of our own sessions reaches a handler that asks for it.
The writer of that commit announces it in process itself, with the event rows, once its
commit returns; the notice often arrives first (one socket read against the rest of the
writer's pipeline) and would send every event stream to read the log for rows on their
way. Late, it is the fallback for a writer cut off between its commit and that."""


async def listen(
    url: str,
    handlers: Mapping[str, Handler],
    *,
    own_sessions: Container[int] = frozenset(),
    late_echoes: Collection[str] = (),
) -> None:
    """LISTEN on each channel and call its handler with every payload, forever; on the
    ``late_echoes`` channels, those sent by ``own_sessions`` (backend pids) ECHO_DELAY_S
    later.

    Runs on its own connection (a pooled one would be handed to others between
    notifications) and reconnects after the database comes back.
    """
    loop = asyncio.get_running_loop()
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
                    if on_notice is None:
                        continue
                    if notice.channel in late_echoes and notice.pid in own_sessions:
                        loop.call_later(ECHO_DELAY_S, on_notice, notice.payload)
                    else:
                        on_notice(notice.payload)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("LISTEN connection lost; reconnecting in %.1fs", delay, exc_info=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
