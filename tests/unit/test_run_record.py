"""A run's whole record (``RunStore.run_record``, the trace's head) is read at one
instant, on SQLite and PostgreSQL: a write that lands while it is being read is not
half in it. Before, a trace read while its run moved on could show the run `pending`
beside the events and step of its planning."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runtime.events import EventType
from runtime.lifecycle import State, Trigger
from runtime.model import Decision, Step, utcnow
from runtime.store import records
from runtime.store.base import RunStore
from runtime.store.records import ShownStep, log_pages
from tests.unit.conftest import MakeRun
from tests.unit.test_store import store_of


async def start_planning(store: RunStore, run_id: str) -> None:
    await store.transition(run_id, Trigger.START, expect=State.PENDING)
    decision = Decision(kind="finish", summary="done", answer="42")
    await store.record_step(
        Step(run_id=run_id, step_index=0, decision=decision, started_at=utcnow())
    )


async def test_a_write_landing_while_the_record_is_read_is_not_half_in_it(
    backend: object, make_run: MakeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_of(backend)
    run = await make_run(store)
    writer: list[asyncio.Task[None]] = []
    read_steps = records.shown_step_rows

    async def steps_after_a_write(tx: Any, run_id: str) -> list[ShownStep]:
        # Between the run row and its steps: the run starts planning and records its
        # first step (PostgreSQL commits it meanwhile; SQLite's writer waits its turn).
        writer.append(asyncio.create_task(start_planning(store, run_id)))
        await asyncio.sleep(0.3)
        return await read_steps(tx, run_id)

    monkeypatch.setattr(records, "shown_step_rows", steps_after_a_write)
    record = await store.run_record(run.run_id)
    monkeypatch.undo()
    await writer[0]

    assert record is not None
    assert (record.run.state, record.last_seq, record.steps) == (State.PENDING, 1, [])
    after = await store.run_record(run.run_id)
    assert after is not None
    assert (after.run.state, after.last_seq, len(after.steps)) == (State.PLANNING, 2, 1)


async def test_the_log_is_read_up_to_the_records_instant(
    backend: object, make_run: MakeRun
) -> None:
    store = store_of(backend)
    run = await make_run(store)
    record = await store.run_record(run.run_id)
    assert record is not None
    for i in range(5):  # appended after the record was read
        await store.append_event(run.run_id, EventType.ERROR, {"i": i})
    through = [
        [e.seq for e in page]
        async for page in log_pages(store.list_events, run.run_id, 0, 2, record.last_seq + 2)
    ]
    assert through == [[1, 2], [3]]
    everything = [
        e.seq async for page in log_pages(store.list_events, run.run_id, 0, 4) for e in page
    ]
    assert everything == [1, 2, 3, 4, 5, 6]


async def test_a_run_that_is_not_there_has_no_record(backend: object) -> None:
    assert await store_of(backend).run_record("run-nope") is None
