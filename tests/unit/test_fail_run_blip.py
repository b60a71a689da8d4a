"""A run's failure whose recording meets a database blip once: the write of ``failed``
refused one time and taken the next, as a failover or a dropped connection would.

The run must end as the failure it was (its code, its record: approval_result events
for its approvals, error, state), not be left in between: before the failure's writes
were one transaction, its approvals were expired before the write that failed, and the
drive that retried resumed the graph, whose approval node read the expired approval as
a human's rejection and went on.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec
from runtime.errors import Code
from runtime.lifecycle import State
from runtime.model import Decision, ProposedCall, RunCreate
from runtime.planner import PlannerView
from runtime.policy import DefaultPolicy
from runtime.retry import DriveRetry, after_failed_drive
from runtime.store.sqlite import SqliteRunStore
from server.host import Host, open_host
from server.settings import Settings
from tests.agents import ScriptPlanner, build_tools, counter_lines
from tests.unit.test_reconcile_unanswered import left_mid_transfer, settings_for
from tests.unit.test_unrecordable_failure import approve, ended, parked_on_its_second_wire

MAX_FAILURES = 3
RETRY_S = 0.05


def counted_then_wired(view: PlannerView) -> Decision:
    """A counter (compensable), then a wire a human must approve: a run that parks with
    an effect a cancel can undo."""
    args: dict[str, object]
    if not view.observations:
        tool, args = "counter", {"label": "first"}
    elif len(view.observations) == 1:
        tool, args = "wire", {"amount": 9, "hold_s": 0}
    else:
        return Decision(kind="finish", summary="done", answer="wired")
    return Decision(
        kind="tool_calls", summary=f"call {tool}", tool_calls=[ProposedCall(tool=tool, args=args)]
    )


def build_agents(settings: Settings) -> list[AgentSpec]:
    tools = build_tools(settings.data_dir)
    return [
        AgentSpec(
            agent_id="counted_then_wired",
            description="counter, then a wire",
            builder=build_run_graph(ScriptPlanner(counted_then_wired), tools, DefaultPolicy()),
            tools=tools,
        )
    ]


@pytest.fixture
async def host(database_url: str, data_dir: Path) -> AsyncIterator[Host]:
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents", f"{__name__}:build_agents"],
        max_drive_failures=MAX_FAILURES,
        drive_retry_seconds=RETRY_S,
    )
    async with open_host(settings) as opened:
        yield opened


def moving_to(state: State) -> str:
    """SQL: a write that moves the run to ``state``."""
    return f"NEW.state = '{state.value}' AND OLD.state <> '{state.value}'"


async def refuse(
    host: Host, database_url: str, name: str, when: str, times: int, table: str = "runs"
) -> None:
    """The database refuses the first ``times`` updates of ``table`` that ``when`` (SQL on
    NEW and OLD) holds for, with the error of a database away for a moment (an
    OperationalError, as a failover's or a full disk's), then takes them."""
    if database_url.startswith("sqlite:///"):
        left = itertools.count(times, -1)

        def refusing() -> int:
            if next(left) > 0:
                raise sqlite3.OperationalError("disk I/O error")
            return 0

        # On the store's own connection, which alone writes runs and their calls: a
        # temporary trigger may call a function that connection has.
        conn = cast(SqliteRunStore, host.store)._conn._conn
        conn.create_function(f"{name}_once", 0, refusing)
        conn.execute(
            f"CREATE TEMP TRIGGER {name} BEFORE UPDATE ON main.{table} WHEN {when} "
            f"BEGIN SELECT {name}_once(); END"
        )
        return
    # A sequence, not a table: a refusal rolls back its transaction, not nextval.
    with psycopg.connect(database_url, autocommit=True) as pg:
        pg.execute(f"CREATE SEQUENCE {name}_seq")
        pg.execute(
            f"""CREATE FUNCTION {name}() RETURNS trigger AS $$
            BEGIN
                IF {when} AND nextval('{name}_seq') <= {times} THEN
                    RAISE EXCEPTION 'could not write to file' USING ERRCODE = 'disk_full';
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql"""
        )
        each = f"FOR EACH ROW EXECUTE FUNCTION {name}()"
        pg.execute(f"CREATE TRIGGER {name} BEFORE UPDATE ON {table} {each}")


def record(events: list[Any]) -> list[tuple[str, Any]]:
    """The events that say how the run ended, in order: approvals decided, errors, the
    state changes from executing on."""
    kept = []
    for e in events:
        if e.type == "approval_result":
            kept.append((e.type, (e.data["decision"], e.data["decided_by"])))
        elif e.type == "error":
            kept.append((e.type, e.data["code"]))
        elif e.type == "state" and e.data["to"] in ("waiting_human", "failed", "succeeded"):
            kept.append((e.type, e.data["to"]))
    return kept


async def test_a_failure_at_the_drive_limit_whose_write_fails_once_ends_the_run(
    host: Host, database_url: str
) -> None:
    """Its first wire approved, the run goes on to its second and parks for it: the
    database refuses the park, drive after drive; at the limit the run is failed, and
    that write is refused once too. The drive that follows meets the park refused once
    more and fails the run: CHECKPOINT_ERROR, the second wire's approval expired once,
    the wire never run. (It was read as a human's rejection instead, and replanned into
    a run that succeeded.)"""
    run, _ = await host.engine.create_run(RunCreate(agent_id="double_wirer", input="x"))
    parked = await host.engine.wait_settled(run.run_id, within_s=30)
    assert parked.state is State.WAITING_HUMAN
    await refuse(host, database_url, "parks", moving_to(State.WAITING_HUMAN), MAX_FAILURES + 1)
    await refuse(host, database_url, "fails", moving_to(State.FAILED), 1)

    await approve(host, parked)
    final = await ended(host, run.run_id, within_s=30)
    await host.engine.wait_settled(run.run_id, within_s=10)

    events = await host.store.list_events(run.run_id)
    assert final.state is State.FAILED, record(events)
    assert final.outcome is not None and final.outcome.code is Code.CHECKPOINT_ERROR
    calls = await host.store.list_tool_calls(run.run_id)
    assert [(c.tool, c.status) for c in calls] == [("wire", "succeeded")]
    assert final.outcome.side_effects == [calls[0].tool_call_id]
    approvals = await host.store.list_approvals(run_id=run.run_id)
    assert [a.status for a in approvals] == ["approved", "expired"]
    assert record(events)[-5:] == [
        ("approval_result", ("approved", "u-mgr")),
        ("approval_result", ("expired", "runtime")),
        ("error", "CALL_NOT_RUN"),  # the second wire, never run
        ("error", "CHECKPOINT_ERROR"),
        ("state", "failed"),
    ]


async def test_a_failure_after_failed_drives_whose_write_fails_once_leaves_the_approval(
    host: Host, database_url: str
) -> None:
    """At the limit of drives failing on the database, fail_run's write of ``failed``
    is refused once: handed back, the run is still parked on its approval, pending, for
    a human to decide; the drive that follows parks it again rather than resume the
    graph with the approval expired (which read it as rejected and replanned: the run
    then succeeded without the wire a human never saw decided)."""
    parked, _ = await parked_on_its_second_wire(host)
    assert parked.pending_approval is not None
    approval_id = parked.pending_approval.approval_id
    version = await host.store.take_lease(parked.run_id, "w1", 30.0)
    assert version is not None
    view = host.store.fenced(parked.run_id, version)
    await refuse(host, database_url, "blip", moving_to(State.FAILED), 1)
    retry = DriveRetry(max_failures=MAX_FAILURES)
    full = sqlite3.OperationalError("database or disk is full")

    delay = await after_failed_drive(view, parked.run_id, MAX_FAILURES, full, retry)
    assert delay == retry.delay(MAX_FAILURES)
    # Handed back as the engine does after a failed drive: driven again.
    await host.store.release_lease(
        parked.run_id, "w1", version, needs_drive=None, retry_in=RETRY_S, failures=MAX_FAILURES
    )
    host.engine.wake()
    async with asyncio.timeout(30):
        while True:  # until a drive has taken it and let it go
            lease = await host.store.lease_of(parked.run_id)
            assert lease is not None
            if not lease["needs_drive"] and lease["lease_owner"] is None:
                break
            await asyncio.sleep(0.02)
    settled = await host.engine.wait_settled(parked.run_id, within_s=30)

    approval = await host.store.get_approval(approval_id)
    events = await host.store.list_events(parked.run_id)
    assert approval is not None and approval.status == "pending", record(events)
    assert settled.state is State.WAITING_HUMAN, settled.outcome
    assert not [
        e for e in events if e.type == "approval_result" and e.data["decision"] == "expired"
    ]
    # A human still decides it, and the run goes on as approved.
    await approve(host, settled)
    final = await ended(host, parked.run_id, within_s=30)
    assert final.state is State.SUCCEEDED, final.outcome


@pytest.mark.parametrize("compensate", [False, True])
async def test_a_cancel_of_a_parked_run_whose_failure_fails_once_ends_cancelled(
    host: Host, database_url: str, data_dir: Path, compensate: bool
) -> None:
    """A run parked on an approval is cancelled; the write of ``failed`` is refused
    once. The cancel's drive is retried and ends the run as the cancel: RUN_CANCELLED,
    its compensation run once and listed, its approval expired once."""
    run, _ = await host.engine.create_run(RunCreate(agent_id="counted_then_wired", input="x"))
    parked = await host.engine.wait_settled(run.run_id, within_s=30)
    assert parked.state is State.WAITING_HUMAN and parked.pending_approval is not None
    [counted] = await host.store.list_tool_calls(run.run_id)
    await refuse(host, database_url, "blip", moving_to(State.FAILED), 1)

    await host.engine.cancel(run.run_id, "stop", compensate=compensate, wait_s=0)
    final = await ended(host, run.run_id, within_s=30)
    await host.engine.wait_settled(run.run_id, within_s=10)

    assert final.state is State.FAILED
    assert final.outcome is not None and final.outcome.code is Code.RUN_CANCELLED
    assert final.outcome.side_effects == [counted.tool_call_id]
    assert final.outcome.compensations == ([counted.tool_call_id] if compensate else [])
    assert final.pending_approval is None
    undone = [line for line in counter_lines(data_dir) if line.endswith("undo")]
    assert len(undone) == (1 if compensate else 0)
    approval = await host.store.get_approval(parked.pending_approval.approval_id)
    assert approval is not None and approval.status == "expired"
    events = await host.store.list_events(run.run_id)
    assert record(events)[-5:] == [
        ("state", "waiting_human"),
        ("approval_result", ("expired", "runtime")),
        ("error", "CALL_NOT_RUN"),  # the wire it was parked on
        ("error", "RUN_CANCELLED"),
        ("state", "failed"),
    ]
    lease = await host.store.lease_of(run.run_id)
    assert lease is not None and not lease["needs_drive"] and lease["lease_owner"] is None


async def test_a_call_whose_outcome_is_unknown_ends_the_run_so_through_a_blip(
    database_url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transfer left running by a host that stopped, whose tool's reconcile never
    answers: at the limit of drives failing on it the run is failed TOOL_OUTCOME_UNKNOWN,
    and that write is refused once. The drive that follows finds the call still running,
    asks again, and fails the run so: not with the call closed ``unknown`` by a failure
    that was not recorded, which the graph, resumed, took for a question for a human
    and parked the run on it."""
    settings = settings_for(database_url, data_dir)
    run_id = await left_mid_transfer(settings, monkeypatch)
    async with open_host(settings) as host:
        await refuse(host, database_url, "blip", moving_to(State.FAILED), 1)
        final = await host.engine.wait_settled(run_id, within_s=60)
        [call] = await host.store.list_tool_calls(run_id)
        events = await host.store.list_events(run_id)

    assert final.state is State.FAILED, record(events)
    assert final.outcome is not None and final.outcome.code is Code.TOOL_OUTCOME_UNKNOWN
    assert call.status == "unknown" and call.attempts == 1
    assert final.outcome.side_effects == [call.tool_call_id]
    results = [e.data for e in events if e.type == "result"]
    assert [(r["tool_call_id"], r["status"]) for r in results] == [(call.tool_call_id, "unknown")]
    assert record(events)[-2:] == [("error", "TOOL_OUTCOME_UNKNOWN"), ("state", "failed")]
