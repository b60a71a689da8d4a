"""Fencing of the batched writes: a worker whose lease was taken over writes nothing.

The store checks the fence inside the statement or transaction that writes (a
transition's single statement on PostgreSQL, the first write of a transaction
otherwise); these tests hold each kind of write to it, on both dialects.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runtime.adapter import failure_trigger
from runtime.errors import Code
from runtime.events import EventType
from runtime.lifecycle import State, Trigger
from runtime.model import Decision, Step, ToolCall, utcnow
from runtime.store.base import LeaseLost, RunStore
from tests.unit.conftest import MakeRun


def store_of(backend: object) -> RunStore:
    return backend.store  # type: ignore[attr-defined,no-any-return]


def ledger_row(run_id: str) -> ToolCall:
    now = utcnow()
    return ToolCall(
        tool_call_id=f"{run_id}-s0-c0",
        run_id=run_id,
        step_index=0,
        call_index=0,
        tool="noop",
        version="1",
        args={},
        args_hash="h",
        status="running",
        idempotency_key=f"idem-{run_id}",
        attempts=0,
        side_effect=True,
        created_at=now,
        updated_at=now,
    )


async def stale_and_current(store: RunStore, run_id: str) -> tuple[RunStore, RunStore]:
    first = await store.take_lease(run_id, "w1", -1.0)  # expired at once: taken over
    second = await store.take_lease(run_id, "w2", 30.0)  # a takeover bumps the version
    assert first is not None and second == first + 1
    return store.fenced(run_id, first), store.fenced(run_id, second)


async def test_a_stale_lease_writes_nothing(backend: object, make_run: MakeRun) -> None:
    store = store_of(backend)
    run = await make_run(store)
    stale, current = await stale_and_current(store, run.run_id)
    step = Step(
        run_id=run.run_id,
        step_index=0,
        decision=Decision(kind="finish", answer="x"),
        started_at=utcnow(),
    )

    with pytest.raises(LeaseLost):
        await stale.transition(run.run_id, Trigger.START, expect=State.PENDING)
    with pytest.raises(LeaseLost):
        await stale.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})
    with pytest.raises(LeaseLost):
        await stale.record_step(step)
    with pytest.raises(LeaseLost):
        await stale.append_event(run.run_id, EventType.ERROR, {"m": "stale"})

    after = await stale.get_run(run.run_id)  # reading is allowed
    assert after is not None and after.state is State.PENDING
    assert [e.seq for e in await store.list_events(run.run_id)] == [1]
    assert await store.list_tool_calls(run.run_id) == []
    assert await store.get_step(run.run_id, 0) is None

    moved = await current.transition(run.run_id, Trigger.START, expect=State.PENDING)
    row, claimed = await current.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})
    assert moved.state is State.PLANNING
    assert claimed and row.attempts == 1
    for result in (None, {"status": "succeeded"}):
        with pytest.raises(LeaseLost):
            await stale.update_tool_call(row.tool_call_id, result=result, status="succeeded")
    assert (await store.get_tool_call(row.tool_call_id)).status == "running"  # type: ignore[union-attr]
    done = await current.update_tool_call(
        row.tool_call_id, result={"status": "succeeded"}, status="succeeded", output={"ok": 1}
    )
    again = await current.update_tool_call(
        row.tool_call_id, result={"status": "failed"}, status="failed"
    )
    assert done.status == again.status == "succeeded" and done.output == {"ok": 1}
    events = await store.list_events(run.run_id)
    assert [(e.seq, e.type) for e in events] == [
        (1, "state"),
        (2, "state"),
        (3, "action"),
        (4, "result"),
    ]


async def test_a_transition_from_another_state_is_refused(
    backend: object, make_run: MakeRun
) -> None:
    from runtime.errors import Code, RuntimeProblem

    store = store_of(backend)
    run = await make_run(store)
    seen: list[tuple[str, int]] = []
    store.add_listener(lambda run_id, seq, _rows: seen.append((run_id, seq)))

    with pytest.raises(RuntimeProblem) as info:
        await store.transition(run.run_id, Trigger.NEXT_STEP, expect=State.EXECUTING)
    assert info.value.code is Code.RUN_STATE_CONFLICT

    done = await store.transition(
        run.run_id,
        Trigger.START,
        expect=State.PENDING,
        events=[(EventType.ERROR, {"m": "before"})],
    )
    events = await store.list_events(run.run_id)
    assert done.state is State.PLANNING
    assert [(e.seq, e.type) for e in events] == [(1, "state"), (2, "error"), (3, "state")]
    assert events[2].data == {"from": "pending", "to": "planning", "trigger": "start"}
    assert seen == [(run.run_id, 3)]  # one wake-up per transaction, with its last seq


async def test_a_new_ledger_row_is_claimed_once(backend: object, make_run: MakeRun) -> None:
    store = store_of(backend)
    run = await make_run(store)

    first, claimed_first = await store.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})
    again, claimed_again = await store.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})

    assert claimed_first and not claimed_again
    assert first.attempts == again.attempts == 1
    assert [e.type for e in await store.list_events(run.run_id)] == ["state", "action"]


async def test_a_compensation_claimed_by_a_dead_drive_is_claimed_again(
    backend: object, make_run: MakeRun
) -> None:
    """A drive died while it compensated (its claim stays, its release never came):
    the drive that takes the run over claims it again, where it used to skip it for good
    and end the run without the compensation, and without saying so."""
    store = store_of(backend)
    run = await make_run(store)
    first = await store.take_lease(run.run_id, "w1", -1.0)  # it will have died
    assert first is not None
    dead = store.fenced(run.run_id, first)
    row, _ = await dead.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})
    await dead.update_tool_call(row.tool_call_id, result=None, status="succeeded")
    assert await dead.claim_compensation(row.tool_call_id)

    second = await store.take_lease(run.run_id, "w2", 30.0)
    assert second == first + 1
    taker = store.fenced(run.run_id, second)
    assert await taker.claim_compensation(row.tool_call_id)
    assert not await taker.claim_compensation(row.tool_call_id)  # one claim per drive
    with pytest.raises(LeaseLost):
        await dead.claim_compensation(row.tool_call_id)
    await taker.release_compensation(row.tool_call_id, done=True)
    assert not await store.claim_compensation(row.tool_call_id)  # done is done


# PostgreSQL's alone: SQLite serialises its writers, with no row locks to take in turn.
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_stale_failure_never_holds_up_the_holders_outcome(
    backend: object, make_run: MakeRun
) -> None:
    """A worker that lost the lease fails the run (its drives failed on the database)
    while the new holder records a call's outcome. The stale one closed the calls left
    running before it locked the run row, the holder's write locks them the other way
    round: a deadlock, whose victim was the holder's outcome of a call that had
    happened. The stale one must lose, and the outcome stand."""
    store = store_of(backend)
    run = await make_run(store)
    stale, current = await stale_and_current(store, run.run_id)
    await current.transition(run.run_id, Trigger.START, expect=State.PENDING)
    await current.transition(run.run_id, Trigger.PLAN_READY, expect=State.PLANNING)
    row, claimed = await current.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})
    assert claimed
    reached, go = asyncio.Event(), asyncio.Event()
    lock_run = stale._lock_run

    async def held_back(tx: Any, run_id: str, columns: str) -> Any:
        reached.set()  # inside end_failed's transaction, before it locks the run row
        await go.wait()
        return await lock_run(tx, run_id, columns)

    stale._lock_run = held_back  # type: ignore[method-assign]
    why = {"code": "CHECKPOINT_ERROR", "message": "the drives failed"}
    ending = asyncio.create_task(
        stale.end_failed(
            run.run_id,
            lambda now: failure_trigger(Code.CHECKPOINT_ERROR, now),
            expect=None,
            code=Code.CHECKPOINT_ERROR,
            calls=("cancelled", why),
            events=[(EventType.ERROR, why)],
            fields={},
        )
    )
    await reached.wait()
    outcome = asyncio.create_task(
        current.update_tool_call(
            row.tool_call_id, result={"status": "succeeded"}, status="succeeded", output={"ok": 1}
        )
    )
    await asyncio.wait({outcome}, timeout=0.5)  # (its write under way, or done)
    go.set()
    lost, recorded = await asyncio.gather(ending, outcome, return_exceptions=True)
    assert isinstance(lost, LeaseLost), lost
    assert not isinstance(recorded, BaseException), recorded
    call = await store.get_tool_call(row.tool_call_id)
    assert call is not None and (call.status, call.output) == ("succeeded", {"ok": 1})
    assert (await store.get_run(run.run_id)).state is State.EXECUTING  # type: ignore[union-attr]
