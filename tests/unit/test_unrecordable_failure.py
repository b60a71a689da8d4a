"""A drive that fails on something other than the database, whose failure cannot be
recorded either (the reads ``fail_run`` makes raise on the same corrupt row): it is
handed back and driven again, but only ``max_drive_failures`` times in a row; then the
run ends with a last-resort failure that reads none of its rows (``RunStore.fail_unread``).

Before that bound, a ledger row whose stored value no longer validated had the run
driven again for ever, a cancel unable to end it."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runtime.errors import Code
from runtime.lifecycle import State, Trigger
from runtime.model import Run, RunCreate
from runtime.retry import DriveRetry, after_failed_drive
from runtime.store.base import LeaseLost
from server.host import Host, open_host
from server.settings import Settings

MAX_FAILURES = 3
RETRY_S = 0.05
UNRECORDED = "could not record the failure of"


@pytest.fixture
async def host(database_url: str, data_dir: Path) -> AsyncIterator[Host]:
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents"],
        max_drive_failures=MAX_FAILURES,
        drive_retry_seconds=RETRY_S,
    )
    async with open_host(settings) as opened:
        yield opened


async def parked_on_its_second_wire(host: Host) -> tuple[Run, str]:
    """A run whose first wire (a side effect) a human approved and that ran, parked on
    the approval of its second; and the first wire's tool_call_id."""
    engine = host.engine
    run, _ = await engine.create_run(RunCreate(agent_id="double_wirer", input="x"))
    parked = await engine.wait_settled(run.run_id, within_s=30)
    assert parked.state is State.WAITING_HUMAN and parked.pending_approval is not None
    await approve(host, parked)
    parked = await engine.wait_settled(run.run_id, within_s=30)
    assert parked.state is State.WAITING_HUMAN and parked.pending_approval is not None
    calls = await host.store.list_tool_calls(run.run_id)
    assert [(c.tool, c.status) for c in calls] == [("wire", "succeeded")]
    return parked, calls[0].tool_call_id


async def approve(host: Host, parked: Run) -> None:
    assert parked.pending_approval is not None
    approval_id = parked.pending_approval.approval_id
    await host.engine.decide(
        parked.run_id, approval_id, "approve", decided_by="u-mgr", comment=None
    )


async def corrupt(host: Host, tool_call_id: str) -> None:
    """A ledger row whose status the model refuses: every read of the run's calls raises."""
    async with host.store.tx() as tx:
        await tx.execute(
            "UPDATE tool_calls SET status = 'exploded' WHERE tool_call_id = ?", (tool_call_id,)
        )


async def ended(host: Host, run_id: str, within_s: float = 10.0) -> Run:
    """The run once it has ended (a TimeoutError if it goes on being driven)."""
    async with asyncio.timeout(within_s):
        while True:
            found = await host.store.get_run_to_drive(run_id)
            assert found is not None
            if found.run.state in (State.SUCCEEDED, State.FAILED):
                return found.run
            await asyncio.sleep(0.02)


async def test_a_failure_that_cannot_be_recorded_ends_the_run_after_the_limit(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    parked, wire = await parked_on_its_second_wire(host)
    await corrupt(host, wire)
    assert parked.pending_approval is not None
    with caplog.at_level(logging.ERROR, logger="runtime.engine"):
        # Approved, the second wire runs, and the run's end reads the ledger: it raises,
        # and so does fail_run, on the same row.
        await approve(host, parked)
        final = await ended(host, parked.run_id)
        await host.engine.wait_settled(parked.run_id, within_s=10)

    assert final.state is State.FAILED
    assert final.outcome is not None and final.outcome.code is Code.INTERNAL_ERROR
    assert "ValidationError" in final.outcome.message  # the original error, named
    assert "could not be read" in final.outcome.message
    # Both wires may have happened: listed as effects that may have, the ledger unread.
    ids = await side_effect_ids(host, parked.run_id)
    assert len(ids) == 2 and wire in ids
    assert sorted(final.outcome.side_effects) == sorted(ids)
    # Driven MAX_FAILURES times: the first moved the run on (its second wire ran), so
    # the count starts there; the last fails the run unread.
    unrecorded = [r.getMessage() for r in caplog.records if r.getMessage().startswith(UNRECORDED)]
    assert [m.endswith("handing it back") for m in unrecorded] == [True, True, False], unrecorded
    events = await host.store.list_events(parked.run_id)
    errors = [e.data for e in events if e.type == "error"]
    assert [e["code"] for e in errors] == ["INTERNAL_ERROR"]
    assert events[-1].type == "state" and events[-1].data["to"] == "failed"
    lease = await host.store.lease_of(parked.run_id)
    assert lease is not None and not lease["needs_drive"] and lease["lease_owner"] is None


async def side_effect_ids(host: Host, run_id: str) -> list[str]:
    async with host.store.read() as tx:
        rows = await tx.fetchall(
            "SELECT tool_call_id FROM tool_calls WHERE run_id = ? AND side_effect = 1", (run_id,)
        )
    return [r["tool_call_id"] for r in rows]


async def test_a_cancel_ends_it_at_once_as_cancelled_and_expires_its_approval(
    database_url: str, data_dir: Path
) -> None:
    """Parked on an approval, the ledger corrupt: the cancel's drive cannot settle the
    run's calls nor record that it failed. It ends the run as cancelled at once (not
    after the drives in a row a limit of 1000 allows), its approval expired, and the
    cancel answers with it rather than after the lease's 30 s."""
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents"],
        max_drive_failures=1000,
        drive_retry_seconds=RETRY_S,
    )
    async with open_host(settings) as host:
        parked, wire = await parked_on_its_second_wire(host)
        assert parked.pending_approval is not None
        await corrupt(host, wire)
        loop = asyncio.get_running_loop()
        started = loop.time()
        after = await host.engine.cancel(parked.run_id, "changed my mind", compensate=True)
        took = loop.time() - started
        await host.engine.wait_settled(parked.run_id, within_s=10)
        approval = await host.store.get_approval(parked.pending_approval.approval_id)
        events = await host.store.list_events(parked.run_id)
        ids = await side_effect_ids(host, parked.run_id)

    assert after.state is State.FAILED, after
    assert took < 5, took
    assert after.outcome is not None and after.outcome.code is Code.RUN_CANCELLED
    assert after.outcome.message.startswith("changed my mind; the cancel could not be carried out")
    assert "the compensation it asked for may not have run" in after.outcome.message
    assert after.outcome.compensations == [] and after.outcome.side_effects == [wire]
    assert ids == [wire]  # the second wire never ran
    assert after.pending_approval is None
    assert approval is not None and approval.status == "expired"
    assert approval.decided_by == "runtime"
    tail = [
        (e.type, e.data.get("decision") or e.data.get("code") or e.data.get("to"))
        for e in events[-3:]
    ]
    assert tail == [
        ("approval_result", "expired"),
        ("error", "RUN_CANCELLED"),
        ("state", "failed"),
    ]
    assert events[-1].data["trigger"] == "cancel"


async def test_the_last_resort_respects_the_lease_fence(host: Host) -> None:
    parked, wire = await parked_on_its_second_wire(host)
    await corrupt(host, wire)
    lease = await host.store.lease_of(parked.run_id)
    assert lease is not None
    stale = host.store.fenced(parked.run_id, int(lease["lease_version"]) + 1)

    with pytest.raises(LeaseLost):
        await stale.fail_unread(
            parked.run_id, Code.INTERNAL_ERROR, "stale", lambda _: Trigger.EXEC_ERROR
        )

    found = await host.store.get_run_to_drive(parked.run_id)
    assert found is not None and found.run.state is State.WAITING_HUMAN
    assert parked.pending_approval is not None
    approval = await host.store.get_approval(parked.pending_approval.approval_id)
    assert approval is not None and approval.status == "pending"  # rolled back with it
    assert (await host.store.list_events(parked.run_id))[-1].type == "state"


async def test_a_database_failure_that_lasts_ends_the_run_unread_too(host: Host) -> None:
    """At the limit of drives failing on the database, a CHECKPOINT_ERROR that fail_run
    cannot record (the same corrupt row) is recorded unread, not handed back for ever;
    one it cannot record because the database still fails is handed back."""
    parked, wire = await parked_on_its_second_wire(host)
    await corrupt(host, wire)
    version = await host.store.take_lease(parked.run_id, "w1", 30.0)
    assert version is not None
    view = host.store.fenced(parked.run_id, version)
    retry = DriveRetry(max_failures=MAX_FAILURES)
    full = sqlite3.OperationalError("database or disk is full")

    class Away:  # fail_run's first read meets the database gone again
        def __getattr__(self, name: str) -> object:
            return getattr(view, name)

        async def get_run(self, run_id: str) -> Run | None:
            raise full

    away: Any = Away()
    assert await after_failed_drive(away, parked.run_id, MAX_FAILURES, full, retry) == retry.delay(
        MAX_FAILURES
    )
    assert await after_failed_drive(view, parked.run_id, MAX_FAILURES, full, retry) is None

    found = await host.store.get_run_to_drive(parked.run_id)
    assert found is not None and found.run.outcome is not None
    assert found.run.state is State.FAILED
    assert found.run.outcome.code is Code.CHECKPOINT_ERROR
    assert "could not persist" in found.run.outcome.message
    assert found.run.outcome.side_effects == [wire]


async def test_the_last_resort_closes_the_calls_left_running_as_unknown(host: Host) -> None:
    """A call whose handler had started when the run was failed unread may have taken
    effect: it is closed ``unknown``, with its result event, read by its status alone
    (the corrupt row beside it is left as it is)."""
    parked, wire = await parked_on_its_second_wire(host)
    first = await host.store.get_tool_call(wire)
    assert first is not None
    running = first.model_copy(
        update={"tool_call_id": f"{wire}-again", "call_index": 1, "status": "running"}
    )
    await host.store.begin_tool_call(running, {"tool_call_id": running.tool_call_id})
    await corrupt(host, wire)
    version = await host.store.take_lease(parked.run_id, "w1", 30.0)
    assert version is not None
    view = host.store.fenced(parked.run_id, version)

    assert await view.fail_unread(
        parked.run_id, Code.INTERNAL_ERROR, "boom", lambda _: Trigger.EXEC_ERROR
    )

    async with host.store.read() as tx:
        rows = await tx.fetchall(
            "SELECT tool_call_id, status FROM tool_calls WHERE run_id = ?", (parked.run_id,)
        )
    assert {r["tool_call_id"]: r["status"] for r in rows} == {
        wire: "exploded",
        running.tool_call_id: "unknown",
    }
    events = await host.store.list_events(parked.run_id)
    closed = [e.data for e in events if e.type == "result"][-1]
    assert closed["tool_call_id"] == running.tool_call_id and closed["status"] == "unknown"
    assert closed["error"]["code"] == "TOOL_OUTCOME_UNKNOWN"
    assert [e.type for e in events[-4:]] == ["result", "approval_result", "error", "state"]
    found = await host.store.get_run_to_drive(parked.run_id)
    assert found is not None and found.run.state is State.FAILED


@pytest.mark.parametrize("unreadable", [False, True])
async def test_a_lease_lost_while_failing_the_run_is_no_error(
    host: Host, caplog: pytest.LogCaptureFixture, unreadable: bool
) -> None:
    """Another worker took the run (a later lease) while this one failed it, on
    recording the failure (``fail_run``) or, the ledger unreadable, on failing it unread:
    a warning without a traceback, the run left to the new holder."""
    parked, wire = await parked_on_its_second_wire(host)
    if unreadable:
        await corrupt(host, wire)
    version = await host.store.take_lease(parked.run_id, "w1", 30.0)
    assert version is not None
    stale = host.store.fenced(parked.run_id, version - 1)
    retry = DriveRetry(max_failures=MAX_FAILURES)
    full = sqlite3.OperationalError("database or disk is full")

    with caplog.at_level(logging.INFO, logger="runtime.engine"):
        delay = await after_failed_drive(stale, parked.run_id, MAX_FAILURES, full, retry)

    assert delay == retry.delay(MAX_FAILURES)
    traced = [r.getMessage() for r in caplog.records if r.exc_info and r.exc_info[0] is LeaseLost]
    assert traced == []
    lost = [r for r in caplog.records if r.getMessage().startswith("lost the lease on")]
    assert [(r.levelno, r.exc_info) for r in lost] == [(logging.WARNING, None)]
    found = await host.store.get_run_to_drive(parked.run_id)
    assert found is not None and found.run.state is State.WAITING_HUMAN


def refuse_writes(database_url: str, *, calls: bool) -> None:
    """The database refuses a run's failure as ``fail_run`` writes it (and, with
    ``calls``, every new ledger row) with an error that is its driver's and no blip: a
    failover's read-only transaction on PostgreSQL (an InternalError to psycopg), an
    aborting trigger's IntegrityError on SQLite. It takes the last resort's write,
    which says the calls could not be read, as a connection that failed once would: that
    a database error is never taken for a failure that lasts is all that keeps the run
    from being failed unread."""
    refused = "NEW.state = 'failed' AND NEW.outcome NOT LIKE '%could not be read%'"
    if database_url.startswith("sqlite:///"):
        with closing(sqlite3.connect(database_url.removeprefix("sqlite:///"))) as conn:
            raise_ = "SELECT RAISE(ABORT, 'cannot execute in a read-only transaction')"
            conn.execute(
                f"CREATE TRIGGER refuse_failed BEFORE UPDATE ON runs WHEN {refused} "
                f"BEGIN {raise_}; END"
            )
            if calls:
                conn.execute(
                    f"CREATE TRIGGER refuse_calls BEFORE INSERT ON tool_calls BEGIN {raise_}; END"
                )
            conn.commit()
        return
    with psycopg.connect(database_url, autocommit=True) as pg:
        pg.execute(
            f"""CREATE FUNCTION refuse() RETURNS trigger AS $$
            BEGIN
                IF TG_TABLE_NAME = 'runs' THEN  -- (NEW has no state on tool_calls)
                    IF NOT ({refused}) THEN
                        RETURN NEW;
                    END IF;
                END IF;
                RAISE EXCEPTION 'cannot execute % in a read-only transaction', TG_OP
                    USING ERRCODE = 'read_only_sql_transaction';
            END $$ LANGUAGE plpgsql"""
        )
        each = "FOR EACH ROW EXECUTE FUNCTION refuse()"
        pg.execute(f"CREATE TRIGGER refuse_failed BEFORE UPDATE ON runs {each}")
        if calls:
            pg.execute(f"CREATE TRIGGER refuse_calls BEFORE INSERT ON tool_calls {each}")


async def test_a_database_error_recording_the_failure_hands_the_run_back(
    host: Host, database_url: str
) -> None:
    """At the limit of drives failing on the database, fail_run's write refused by the
    database: the run is handed back, not failed unread."""
    parked, _ = await parked_on_its_second_wire(host)
    version = await host.store.take_lease(parked.run_id, "w1", 30.0)
    assert version is not None
    view = host.store.fenced(parked.run_id, version)
    refuse_writes(database_url, calls=False)
    retry = DriveRetry(max_failures=MAX_FAILURES)
    full = sqlite3.OperationalError("database or disk is full")

    delay = await after_failed_drive(view, parked.run_id, MAX_FAILURES, full, retry)

    assert delay == retry.delay(MAX_FAILURES)
    found = await host.store.get_run_to_drive(parked.run_id)
    assert found is not None
    assert found.run.state is State.WAITING_HUMAN, found.run.outcome


async def test_a_drive_whose_failure_the_database_refuses_is_driven_again(
    host: Host, database_url: str
) -> None:
    """A drive failing on a database error that is no blip, whose failure the database
    refuses too: past the limit of drives in a row, the run is still handed back."""
    parked, _ = await parked_on_its_second_wire(host)
    refuse_writes(database_url, calls=True)
    await approve(host, parked)
    async with asyncio.timeout(10):
        while True:  # its second wire refused, and its failure, drive after drive
            lease = await host.store.lease_of(parked.run_id)
            assert lease is not None
            if int(lease["drive_failures"]) > MAX_FAILURES:
                break
            await asyncio.sleep(0.02)

    found = await host.store.get_run_to_drive(parked.run_id)
    assert found is not None
    assert found.run.state is State.EXECUTING, found.run.outcome


async def test_a_row_that_no_longer_validates_is_never_quoted(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    """A stored argument (a secret's among them) that no longer validates: the audit
    surface shows what is wrong with it by field, never its value, and so must the
    failure it causes, in the run's message, its error event and the logs' tracebacks
    (a validation error's text quotes its input)."""
    parked, wire = await parked_on_its_second_wire(host)
    secret = "sk-live-0123456789"
    async with host.store.tx() as tx:
        await tx.execute(
            "UPDATE tool_calls SET args = ? WHERE tool_call_id = ?",
            (f'{{"api_key": "{secret}", "amount": 9', wire),  # cut short: not JSON
        )
    with caplog.at_level(logging.DEBUG):
        await approve(host, parked)
        final = await ended(host, parked.run_id)
        await host.engine.wait_settled(parked.run_id, within_s=10)
    assert final.outcome is not None and final.outcome.code is Code.INTERNAL_ERROR
    assert "args: Input should be a valid dictionary" in final.outcome.message
    events = await host.store.list_events(parked.run_id)
    assert [e.data["message"] for e in events if e.type == "error"] == [final.outcome.message]
    assert "ValidationError" in caplog.text  # what was logged: the failure, and why
    assert secret not in caplog.text and secret not in final.outcome.message
