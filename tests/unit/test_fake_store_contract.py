"""The fake keeps the real store's promises: the same assertions on FakeStore and SQLite.

Only the semantics node tests lean on are pinned here; if one of these fails on
the fake alone, node tests written against it would pass where the runtime fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime import ids
from runtime.errors import Code, RuntimeProblem
from runtime.events import EventType
from runtime.ledger import StoreArtifacts
from runtime.model import Approval, Decision, Step, ToolCall, utcnow
from runtime.services import NodeStore
from runtime.store.sqlite import SqliteRunStore
from tests.unit.conftest import build_run
from tests.unit.fakes import FakeStore


@dataclass
class Stores:
    store: Any  # a NodeStore that can also list events and steps for the assertions
    run_id: str
    other_run: str


@pytest.fixture(params=["fake", "sqlite"])
async def s(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    if request.param == "fake":
        yield Stores(FakeStore("run-a", "run-b"), "run-a", "run-b")
        return
    store = await SqliteRunStore.open(tmp_path / "contract.db")
    try:
        runs = [build_run(), build_run()]
        for run in runs:
            await store.create_run(run, "hash")
        yield Stores(store, runs[0].run_id, runs[1].run_id)
    finally:
        await store.close()


async def types(store: Any, run_id: str) -> list[str]:
    return [e.type for e in await store.list_events(run_id)]


def approval(run_id: str, n: int = 0, args: dict[str, Any] | None = None) -> Approval:
    tc_id = ids.tool_call_id(run_id, 0, n)
    args = args if args is not None else {"amount": 5}
    return Approval(
        approval_id=ids.approval_id(tc_id),
        run_id=run_id,
        tool_call_id=tc_id,
        tool="refund",
        version="1",
        args=args,
        args_hash=ids.content_hash(args),
        risk="high",
        reason="high-risk tool",
        status="pending",
        created_at=utcnow(),
    )


def ledger_row(run_id: str, step: int = 0, index: int = 0) -> ToolCall:
    now = utcnow()
    tc_id = ids.tool_call_id(run_id, step, index)
    return ToolCall(
        tool_call_id=tc_id,
        run_id=run_id,
        step_index=step,
        call_index=index,
        tool="echo",
        version="1",
        args={"text": "a"},
        args_hash=ids.content_hash({"text": "a"}),
        status="running",
        idempotency_key=ids.idempotency_key(tc_id),
        created_at=now,
        updated_at=now,
    )


# -- events and steps ------------------------------------------------------------------


async def test_events_count_per_run_and_dedupe_by_key(s: Stores) -> None:
    store: NodeStore = s.store
    first = await store.append_event(s.run_id, EventType.ERROR, {"code": "X"}, dedupe_key="k")
    again = await store.append_event(s.run_id, EventType.ERROR, {"code": "Y"}, dedupe_key="k")
    plain = await store.append_event(s.run_id, EventType.ERROR, {"code": Code.TOOL_FAILED})
    elsewhere = await store.append_event(s.other_run, EventType.ERROR, {}, dedupe_key="k")

    # Seq 1 is the run's creation.
    assert (first, again, plain, elsewhere) == (2, None, 3, 2)
    events = await s.store.list_events(s.run_id)
    assert [e.data for e in events[1:]] == [{"code": "X"}, {"code": "TOOL_FAILED"}]
    assert [e.seq for e in await s.store.list_events(s.run_id, after=2)] == [3]
    with pytest.raises(RuntimeProblem) as err:
        await store.append_event("run-nobody", EventType.ERROR, {})
    assert err.value.code == Code.RUN_NOT_FOUND


async def test_the_first_recorded_step_wins(s: Stores) -> None:
    store: NodeStore = s.store
    now = utcnow()
    first = Step(run_id=s.run_id, step_index=0, decision=Decision(kind="finish"), started_at=now)
    second = first.model_copy(update={"decision": Decision(kind="finish", answer="other")})

    assert await store.get_step(s.run_id, 0) is None
    assert (await store.record_step(first)).decision == first.decision
    assert (await store.record_step(second)).decision == first.decision
    stored = await store.get_step(s.run_id, 0)
    assert stored is not None and stored.decision == first.decision
    assert await store.get_step(s.other_run, 0) is None


# -- approvals -------------------------------------------------------------------------


async def test_an_approval_is_created_once_with_one_request_event(s: Stores) -> None:
    store: NodeStore = s.store
    row = approval(s.run_id)

    created = await store.ensure_approval(row, {"approval_id": row.approval_id})
    replayed = await store.ensure_approval(
        row.model_copy(update={"reason": "changed"}), {"approval_id": "again"}
    )

    assert created == replayed and replayed.reason == "high-risk tool"
    assert await store.get_approval(row.approval_id) == created
    assert await types(s.store, s.run_id) == ["state", "approval_request"]


async def test_a_decision_is_a_compare_and_set(s: Stores) -> None:
    store: NodeStore = s.store
    row = await store.ensure_approval(approval(s.run_id), {})

    won, first = await store.decide_approval(
        row.approval_id, "approved", decided_by="ann", comment="ok"
    )
    lost, second = await store.decide_approval(
        row.approval_id, "rejected", decided_by="bob", comment=None
    )

    assert (first, second) == (True, False)
    assert (won.status, won.decided_by, won.comment) == ("approved", "ann", "ok")
    assert lost == won and won.decided_at is not None
    results = [e for e in await s.store.list_events(s.run_id) if e.type == "approval_result"]
    assert [e.data["decided_by"] for e in results] == ["ann"]
    with pytest.raises(RuntimeProblem) as err:
        await store.decide_approval("ap-nobody", "approved", decided_by="x", comment=None)
    assert err.value.code == Code.APPROVAL_NOT_FOUND


async def test_an_approval_of_another_run_is_not_found_and_stays_pending(s: Stores) -> None:
    store: NodeStore = s.store
    row = await store.ensure_approval(approval(s.run_id), {})

    with pytest.raises(RuntimeProblem) as err:
        await store.decide_approval(
            row.approval_id, "approved", decided_by="x", comment=None, run_id=s.other_run
        )

    assert err.value.code == Code.APPROVAL_NOT_FOUND
    assert (await store.get_approval(row.approval_id)).status == "pending"  # type: ignore[union-attr]
    assert "approval_result" not in await types(s.store, s.run_id)


async def test_approvals_are_listed_by_run_and_status(s: Stores) -> None:
    store: NodeStore = s.store
    a = await store.ensure_approval(approval(s.run_id, 0), {})
    b = await store.ensure_approval(approval(s.run_id, 1), {})
    await store.ensure_approval(approval(s.other_run, 0), {})
    await store.decide_approval(a.approval_id, "rejected", decided_by="x", comment=None)

    pending = await store.list_approvals(run_id=s.run_id, status="pending")
    assert [r.approval_id for r in pending] == [b.approval_id]
    assert len(await store.list_approvals(run_id=s.run_id)) == 2
    assert len(await store.list_approvals(run_id=s.run_id, limit=1)) == 1


# -- the ledger ------------------------------------------------------------------------


async def test_start_claims_a_new_row_once(s: Stores) -> None:
    store: NodeStore = s.store
    row = ledger_row(s.run_id)

    started, claimed = await store.start_tool_call(row, {"tool_call_id": row.tool_call_id})
    again, claimed_again = await store.start_tool_call(row, {"tool_call_id": "again"})

    assert (claimed, claimed_again) == (True, False)
    assert started.attempts == 1 and again == started
    assert await types(s.store, s.run_id) == ["state", "action"]


async def test_begin_records_without_counting_an_attempt(s: Stores) -> None:
    store: NodeStore = s.store
    row = ledger_row(s.run_id)

    begun = await store.begin_tool_call(row, {})
    again = await store.begin_tool_call(row.model_copy(update={"attempts": 5}), {})

    assert begun.attempts == 0 and again == begun
    assert await types(s.store, s.run_id) == ["state", "action"]


async def test_a_claim_is_a_compare_and_set_on_attempts(s: Stores) -> None:
    store: NodeStore = s.store
    row = await store.begin_tool_call(ledger_row(s.run_id), {})

    claimed = await store.claim_tool_call(row.tool_call_id, 0)
    stale = await store.claim_tool_call(row.tool_call_id, 0)

    assert claimed is not None and claimed.attempts == 1 and stale is None
    why = [{"attempt": 1, "code": "TOOL_UNAVAILABLE", "message": "down"}]
    again = await store.claim_tool_call(row.tool_call_id, 1, retried=why)
    assert again is not None and again.attempts == 2 and again.retried == why
    kept = await store.claim_tool_call(row.tool_call_id, 2)  # the list as it is
    assert kept is not None and kept.attempts == 3 and kept.retried == why
    await store.update_tool_call(row.tool_call_id, status="succeeded")
    assert await store.claim_tool_call(row.tool_call_id, 3) is None  # finished: not claimable
    assert await store.claim_tool_call("tc-nobody", 0) is None


async def test_an_update_moves_only_from_the_expected_status(s: Stores) -> None:
    store: NodeStore = s.store
    row, _ = await store.start_tool_call(ledger_row(s.run_id), {})
    error = {"code": Code.TOOL_OUTCOME_UNKNOWN, "message": "m"}

    unknown = await store.update_tool_call(
        row.tool_call_id, result={"status": "unknown"}, status="unknown", error=error
    )
    ignored = await store.update_tool_call(row.tool_call_id, result={"x": 1}, status="failed")
    rerun = await store.update_tool_call(
        row.tool_call_id, from_status=("unknown",), status="running", error=None
    )

    assert unknown.status == "unknown" and unknown.error == {
        "code": "TOOL_OUTCOME_UNKNOWN",
        "message": "m",
    }
    assert ignored == unknown  # not running: nothing moved, the current row comes back
    assert rerun.status == "running" and rerun.error is None and rerun.attempts == 1
    assert await types(s.store, s.run_id) == ["state", "action", "result"]
    with pytest.raises(RuntimeProblem) as err:
        await store.update_tool_call("tc-nobody", status="failed")
    assert err.value.code == Code.NOT_FOUND


async def test_ledger_rows_are_listed_per_run_in_call_order(s: Stores) -> None:
    store: NodeStore = s.store
    for step, index in ((1, 0), (0, 1), (0, 0)):
        await store.begin_tool_call(ledger_row(s.run_id, step, index), {})
    await store.begin_tool_call(ledger_row(s.other_run), {})

    rows = await store.list_tool_calls(s.run_id)
    assert [(r.step_index, r.call_index) for r in rows] == [(0, 0), (0, 1), (1, 0)]
    got = await store.get_tool_call(rows[0].tool_call_id)
    assert got == rows[0] and await store.get_tool_call("tc-nobody") is None


# -- artifacts -------------------------------------------------------------------------


async def test_artifacts_are_stored_once_and_logged_once_per_run(s: Stores) -> None:
    store: NodeStore = s.store

    first = await StoreArtifacts(store, s.run_id).put(b"{}", "application/json", "a.json")
    await StoreArtifacts(store, s.run_id).put(b"{}", "application/json", "a.json")
    await StoreArtifacts(store, s.other_run).put(b"{}", "application/json", "b.json")

    assert first.artifact_id == ids.artifact_id(b"{}") and first.size == 2
    assert await store.artifact_exists(first.artifact_id)
    assert not await store.artifact_exists(ids.artifact_id(b"other"))
    assert await types(s.store, s.run_id) == ["state", "artifact"]
    assert await types(s.store, s.other_run) == ["state", "artifact"]
    stored = await s.store.get_artifact(first.artifact_id)
    assert stored is not None and stored[1] == b"{}" and stored[0].name == "a.json"
