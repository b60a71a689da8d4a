"""A drive's deferred state changes (runtime.store.journal), on both dialects.

A transition the adapter defers is written in the same commit as the drive's next
write, before it; the drive reads its own deferred changes; with no write coming,
it is written on its own shortly after; a view whose lease is gone writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from runtime.events import EventType
from runtime.lifecycle import State, Trigger
from runtime.model import utcnow
from runtime.store import journal
from runtime.store.base import LeaseLost, Row, RunStore
from runtime.store.sqlite import SqliteRunStore
from tests.unit.conftest import MakeRun
from tests.unit.test_fencing import ledger_row, stale_and_current, store_of


async def leased(store: RunStore, run_id: str) -> RunStore:
    version = await store.take_lease(run_id, "w1", 30.0)
    assert version is not None
    return store.fenced(run_id, version)


async def started(store: RunStore, run_id: str) -> RunStore:
    """The drive's view of a pending run whose planner node has started: "planning"
    is deferred."""
    view = await leased(store, run_id)
    view.defer_transition(run_id, Trigger.START, expect=State.PENDING)
    return view


async def state_of(store: RunStore, run_id: str) -> State:
    run = await store.get_run(run_id)
    assert run is not None
    return run.state


@pytest.fixture
def slow_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """No timer fires during the test: only writes carry the deferred changes."""
    monkeypatch.setattr(journal, "FLUSH_AFTER_S", 60.0)


@pytest.mark.usefixtures("slow_flush")
async def test_a_deferred_transition_commits_with_the_next_write(
    backend: object, make_run: MakeRun
) -> None:
    store = store_of(backend)
    run = await make_run(store)
    view = await leased(store, run.run_id)
    commits: list[list[str]] = []

    def listener(run_id: str, seq: int, rows: Sequence[Row]) -> None:
        commits.append([r["type"] for r in rows])

    store.add_listener(listener)
    target = view.defer_transition(run.run_id, Trigger.START, expect=State.PENDING, step_index=0)
    assert target is State.PLANNING
    assert await state_of(store, run.run_id) is State.PENDING  # nothing written yet
    assert commits == []

    await view.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})

    assert await state_of(store, run.run_id) is State.PLANNING
    # Announced after the one commit that carried both, the state change first.
    assert [t for commit in commits for t in commit] == [
        EventType.STATE.value,
        EventType.ACTION.value,
    ]
    events = await store.list_events(run.run_id)
    assert [(e.type, e.data.get("to")) for e in events] == [
        (EventType.STATE, "pending"),
        (EventType.STATE, "planning"),
        (EventType.ACTION, None),
    ]


@pytest.mark.usefixtures("slow_flush")
async def test_a_deferred_change_is_stamped_when_it_happened(
    backend: object, make_run: MakeRun
) -> None:
    """Not when the write carrying it was sent: on PostgreSQL that write's own events,
    stamped before it took the change, showed an earlier time at a higher seq."""
    store = store_of(backend)
    run = await make_run(store)
    view = await leased(store, run.run_id)
    before = utcnow()
    view.defer_transition(run.run_id, Trigger.START, expect=State.PENDING)
    after = utcnow()
    await asyncio.sleep(0.01)  # the node works a while before its first write

    await view.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})

    _, planning, action = await store.list_events(run.run_id)
    assert planning.data["to"] == "planning" and before <= planning.ts <= after
    assert planning.ts < action.ts


@pytest.mark.usefixtures("slow_flush")
async def test_the_drive_reads_its_own_deferred_state(backend: object, make_run: MakeRun) -> None:
    store = store_of(backend)
    run = await make_run(store)
    view = await started(store, run.run_id)

    assert await state_of(view, run.run_id) is State.PLANNING
    assert await state_of(store, run.run_id) is State.PLANNING


async def test_a_deferred_transition_is_written_soon_without_a_write(
    backend: object, make_run: MakeRun
) -> None:
    store = store_of(backend)
    run = await make_run(store)
    view = await leased(store, run.run_id)
    written = asyncio.Event()
    store.add_listener(lambda run_id, seq, rows: written.set())
    view.defer_transition(run.run_id, Trigger.START, expect=State.PENDING)

    async with asyncio.timeout(journal.FLUSH_AFTER_S * 250):
        await written.wait()
    assert await state_of(store, run.run_id) is State.PLANNING


@pytest.mark.usefixtures("slow_flush")
async def test_a_write_waits_for_a_flush_under_way(backend: object, make_run: MakeRun) -> None:
    store = store_of(backend)
    run = await make_run(store)
    view = await started(store, run.run_id)
    transition = view._transition
    taken = asyncio.Event()

    async def slow_transition(*args: Any, **kwargs: Any) -> Row:
        taken.set()
        await asyncio.sleep(0.1)  # a slow database: the write below could overtake it
        return await transition(*args, **kwargs)

    view._transition = slow_transition  # type: ignore[method-assign]
    flushing = asyncio.create_task(view.flush())
    await taken.wait()  # the flush has taken the deferred change and is writing it

    await view.append_event(run.run_id, EventType.ERROR, {"code": "X", "message": "m"})
    await flushing

    events = await store.list_events(run.run_id)
    assert [e.type for e in events] == [EventType.STATE, EventType.STATE, EventType.ERROR]


@pytest.mark.usefixtures("slow_flush")
async def test_a_stale_views_deferred_transition_writes_nothing(
    backend: object, make_run: MakeRun
) -> None:
    store = store_of(backend)
    run = await make_run(store)
    stale, _current = await stale_and_current(store, run.run_id)
    stale.defer_transition(run.run_id, Trigger.START, expect=State.PENDING)

    with pytest.raises(LeaseLost):
        await stale.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})

    assert await state_of(store, run.run_id) is State.PENDING
    assert await store.get_tool_call(ledger_row(run.run_id).tool_call_id) is None
    with pytest.raises(LeaseLost):  # still pending, still refused
        await stale.flush()


async def test_only_a_drives_view_defers(backend: object, make_run: MakeRun) -> None:
    store = store_of(backend)
    run = await make_run(store)
    assert store.defer_transition(run.run_id, Trigger.START, expect=State.PENDING) is None
    view = await leased(store, run.run_id)
    other = await make_run(store)
    assert view.defer_transition(other.run_id, Trigger.START, expect=State.PENDING) is None


async def test_the_thread_bound_sqlite_store_works_alike(tmp_path: Path, make_run: MakeRun) -> None:
    """The store a LangGraph server's graphs use: every statement on aiosqlite's thread."""
    store = await SqliteRunStore.open(tmp_path / "threads.db", direct=False)
    try:
        run = await make_run(store)
        view = await started(store, run.run_id)
        await view.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})
        assert await state_of(store, run.run_id) is State.PLANNING
        assert [e.type for e in await store.list_events(run.run_id)] == [
            EventType.STATE,
            EventType.STATE,
            EventType.ACTION,
        ]
    finally:
        await store.close()


@pytest.mark.usefixtures("slow_flush")
async def test_a_deferred_change_already_committed_is_not_written_twice(
    backend: object, make_run: MakeRun
) -> None:
    """As after a write cancelled while it committed: the change is pending again, but
    the run is in its target state already."""
    store = store_of(backend)
    run = await make_run(store)
    view = await started(store, run.run_id)
    await store.transition(run.run_id, Trigger.START, expect=State.PENDING)

    await view.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})

    events = await store.list_events(run.run_id)
    assert [e.type for e in events] == [EventType.STATE, EventType.STATE, EventType.ACTION]


@contextlib.contextmanager
def slow_commits(store: SqliteRunStore) -> Iterator[asyncio.Event]:
    """Every COMMIT of ``store`` takes 50 ms (the fsync); the event is set as one starts."""
    execute = store._conn.execute
    committing = asyncio.Event()

    def slow_commit(sql: str, *args: Any) -> Any:
        if sql != "COMMIT":
            return execute(sql, *args)

        async def commit() -> Any:
            committing.set()
            await asyncio.sleep(0.05)
            return await execute(sql, *args)

        return commit()

    store._conn.execute = slow_commit  # type: ignore[method-assign,assignment]
    try:
        yield committing
    finally:
        store._conn.execute = execute  # type: ignore[method-assign]


async def cancelled_as_it_commits(committing: asyncio.Event, write: Awaitable[object]) -> None:
    task = asyncio.ensure_future(write)
    await committing.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.usefixtures("slow_flush")
async def test_a_write_cancelled_while_committing_leaves_the_drive_writing(
    tmp_path: Path, make_run: MakeRun
) -> None:
    store = await SqliteRunStore.open(tmp_path / "cancel.db")
    try:
        run = await make_run(store)
        view = await leased(store, run.run_id)
        view.defer_transition(run.run_id, Trigger.START, expect=State.PENDING)
        with slow_commits(store) as committing:
            await cancelled_as_it_commits(
                committing, view.append_event(run.run_id, EventType.ERROR, {"code": "X"})
            )

        # The commit went through; the lock was held until it had.
        assert await state_of(store, run.run_id) is State.PLANNING
        await view.update_run(run.run_id, step_index=1)  # the drive writes on
        await view.flush()
        events = await store.list_events(run.run_id)
        assert [e.type for e in events] == [EventType.STATE, EventType.STATE, EventType.ERROR]
    finally:
        await store.close()


async def test_a_write_cancelled_while_committing_is_still_announced(
    tmp_path: Path, make_run: MakeRun
) -> None:
    """The events it committed reach the process's streams and waiters at once (SQLite
    has no NOTIFY to tell them later), and only those."""
    store = await SqliteRunStore.open(tmp_path / "cancel.db")
    try:
        run = await make_run(store)
        announced: list[tuple[int, list[str]]] = []
        store.add_listener(
            lambda run_id, seq, rows: announced.append((seq, [r["type"] for r in rows]))
        )
        with slow_commits(store) as committing:
            await cancelled_as_it_commits(
                committing, store.append_event(run.run_id, EventType.ERROR, {"code": "X"})
            )

        [error] = [e for e in await store.list_events(run.run_id) if e.type is EventType.ERROR]
        assert announced == [(error.seq, ["error"])]
    finally:
        await store.close()


async def test_a_timer_that_keeps_failing_backs_off(
    backend: object, make_run: MakeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease lost while the node still thinks: the timer's flushes fail, less and less
    often, and the change stays pending."""
    monkeypatch.setattr(journal, "FLUSH_AFTER_S", 0.005)
    monkeypatch.setattr(journal, "RETRY_MAX_S", 0.05)
    store = store_of(backend)
    run = await make_run(store)
    stale, _current = await stale_and_current(store, run.run_id)
    stale_journal = stale._journal
    assert stale_journal is not None
    flush = stale_journal._flush
    attempts: list[float] = []

    async def counted() -> None:
        attempts.append(asyncio.get_running_loop().time())
        await flush()

    stale_journal._flush = counted
    stale.defer_transition(run.run_id, Trigger.START, expect=State.PENDING)
    await asyncio.sleep(0.4)
    stale.close_journal()
    if stale_journal._flushing is not None:  # a flush under way holds the change taken
        await stale_journal._flushing

    # Waits of 5, 10, 20, 40, 50, 50 … ms, not 5 ms each. A timer never fires early,
    # so a busy machine can only stretch the gaps: lower bounds hold whatever the load.
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert len(gaps) >= 3, attempts
    assert gaps[1] >= 0.009 and gaps[2] >= 0.019, gaps
    assert len(attempts) <= 25, gaps  # every 5 ms would be ~80
    assert len(stale_journal.pending) == 1
    assert await state_of(store, run.run_id) is State.PENDING


@pytest.mark.usefixtures("slow_flush")
async def test_a_deferred_change_the_run_has_gone_past_to_its_end_is_dropped(
    backend: object, make_run: MakeRun
) -> None:
    """The write that carried it was cancelled as it committed, and the drive went on
    to the run's end (a cancel notice cut the drive off as its success committed): put
    back, the change is no longer the run's; writing it raised a conflict, a traceback
    in place of the cancel's own handling."""
    store = store_of(backend)
    run = await make_run(store)
    view = await started(store, run.run_id)
    for trigger, expect in (
        (Trigger.START, State.PENDING),
        (Trigger.PLAN_READY, State.PLANNING),
        (Trigger.DONE, State.EXECUTING),
    ):
        await store.transition(run.run_id, trigger, expect=expect)

    await view.flush()

    assert await state_of(store, run.run_id) is State.SUCCEEDED


@pytest.mark.usefixtures("slow_flush")
async def test_a_drive_giving_up_a_lost_lease_leaves_its_deferred_change_quietly(
    backend: object, make_run: MakeRun, caplog: pytest.LogCaptureFixture
) -> None:
    """The new holder starts the node again and writes its own: a drive that ends
    after losing the lease has nothing to warn about (a database that fails it does)."""
    from runtime.release import flush_quietly

    store = store_of(backend)
    run = await make_run(store)
    stale, _current = await stale_and_current(store, run.run_id)
    stale.defer_transition(run.run_id, Trigger.START, expect=State.PENDING)

    with caplog.at_level(logging.INFO, logger="runtime.engine"):
        await flush_quietly(stale)

    assert await state_of(store, run.run_id) is State.PENDING
    [record] = [r for r in caplog.records if "deferred state change" in r.getMessage()]
    assert record.levelno == logging.INFO and record.exc_info is None
