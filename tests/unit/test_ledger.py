"""execute_once against a real store (SQLite and PostgreSQL): the ledger is the truth."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from runtime import attempts, ids
from runtime.adapter import fail_run, side_effects
from runtime.breaker import BREAKERS
from runtime.errors import Code
from runtime.events import EventType
from runtime.ledger import (
    INLINE_OUTPUT_BYTES,
    RECONCILED_NO_EFFECT,
    STOPPED_ATTEMPT,
    StoreArtifacts,
    execute_once,
    new_ledger_row,
    scrub,
    secret_values,
    settle_cut_off,
)
from runtime.model import RunContext, ToolCall
from runtime.reconcile import ReconcileFailed, ReconcileUnanswered
from runtime.reconcile import reconcile as ask_reconcile
from runtime.store.base import RunStore
from runtime.tooling import REDACTED, ToolBusinessError, ToolContext, ToolSpec, ToolUnavailable
from tests.unit.conftest import MakeRun


class Args(BaseModel):
    label: str = "x"


class Harness:
    """One tool call of one run, and a log of every time the handler really ran."""

    def __init__(self, store: RunStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.ran: list[str] = []  # the idempotency key of each execution
        self.reconciled = 0

    def spec(self, result: Any = None, *, reconcile: Any = "absent", **kwargs: Any) -> ToolSpec:
        async def handler(args: Args, ctx: ToolContext) -> Any:
            self.ran.append(ctx.idempotency_key)
            await asyncio.sleep(0.01)  # give a concurrent caller room to interleave
            if isinstance(result, Exception):
                raise result
            return {"label": args.label} if result is None else result

        async def reconciler(args: Args, ctx: ToolContext) -> Any:
            self.reconciled += 1
            return reconcile

        return ToolSpec(
            "probe",
            "1",
            "test tool",
            Args,
            handler,
            reconcile=None if reconcile == "absent" else reconciler,
            **kwargs,
        )

    def row(self, spec: ToolSpec) -> ToolCall:
        tc_id = ids.tool_call_id(self.run_id, 0, 0)
        args = {"label": "x"}
        return new_ledger_row(self.run_id, 0, 0, tc_id, spec, args, ids.content_hash(args))

    async def execute(
        self, spec: ToolSpec, args: BaseModel | None = None, *, answered: int = 0
    ) -> ToolCall:
        """``answered``: as a drive that knows that many attempts have a result."""
        row = self.row(spec)
        tctx = ToolContext(
            run_id=self.run_id,
            tool_call_id=row.tool_call_id,
            idempotency_key=row.idempotency_key,
            context=RunContext(),
            artifacts=StoreArtifacts(self.store, self.run_id),
        )
        action = {"tool_call_id": row.tool_call_id, "tool": spec.name}
        return await execute_once(
            self.store, spec, row, args or Args(label="x"), tctx, action, answered=answered
        )

    async def leave_running(self, spec: ToolSpec) -> ToolCall:
        """A row as a process that died mid-call leaves it: running, attempt counted."""
        row = self.row(spec)
        await self.store.begin_tool_call(row, {"tool_call_id": row.tool_call_id})
        return await self.store.update_tool_call(row.tool_call_id, attempts=1)


@pytest.fixture
async def h(backend: object, make_run: MakeRun) -> Harness:
    store = backend.store  # type: ignore[attr-defined]
    run = await make_run(store)
    return Harness(store, run.run_id)


# (a) and (b): at most once -------------------------------------------------------


async def test_a_finished_call_is_not_run_again(h: Harness) -> None:
    spec = h.spec()
    first = await h.execute(spec)
    second = await h.execute(spec)

    assert len(h.ran) == 1
    assert first.status == "succeeded" and first.output == {"label": "x"}
    assert second == first
    assert [e.type for e in await h.store.list_events(h.run_id)] == ["state", "action", "result"]


async def test_concurrent_drives_of_one_call_execute_it_once(h: Harness) -> None:
    spec = h.spec()
    rows = await asyncio.gather(h.execute(spec), h.execute(spec), return_exceptions=True)

    assert h.ran == [h.row(spec).idempotency_key]
    assert all(isinstance(r, ToolCall) and r.status == "succeeded" for r in rows), rows


# (c): a row left running by a dead process ---------------------------------------


async def test_idempotent_call_left_running_is_rerun_with_the_same_key(h: Harness) -> None:
    spec = h.spec()
    left = await h.leave_running(spec)

    row = await h.execute(spec)

    assert h.ran == [left.idempotency_key]
    assert row.status == "succeeded" and row.attempts == 2
    # The log shows it about to run again, as it showed its first run.
    actions = [e.data for e in await h.store.list_events(h.run_id) if e.type == "action"]
    assert [(a["tool_call_id"], a.get("rerun"), a.get("attempt")) for a in actions] == [
        (row.tool_call_id, None, None),
        (row.tool_call_id, True, 2),
    ]
    # One result answers both actions: it says why the first attempt has no outcome.
    assert (await result_of(h))["retried"] == [
        {"attempt": 1, "code": "TOOL_OUTCOME_UNKNOWN", "message": STOPPED_ATTEMPT}
    ]


async def test_each_attempt_of_drives_that_stopped_is_on_record(h: Harness) -> None:
    spec = h.spec()
    left = await h.leave_running(spec)
    await h.store.update_tool_call(left.tool_call_id, attempts=2)  # a second drive died too

    row = await h.execute(spec)

    assert row.status == "succeeded" and row.attempts == 3
    assert [(r["attempt"], r["code"]) for r in (await result_of(h))["retried"]] == [
        (1, "TOOL_OUTCOME_UNKNOWN"),
        (2, "TOOL_OUTCOME_UNKNOWN"),
    ]


async def test_an_outcome_reconcile_found_answers_the_stopped_attempt_itself(h: Harness) -> None:
    spec = h.spec(reconcile={"label": "found"}, side_effect=True, idempotent=False)
    await h.leave_running(spec)

    await h.execute(spec)

    assert "retried" not in await result_of(h)  # the effect found is that attempt's


async def test_reconciled_side_effect_is_not_rerun(h: Harness) -> None:
    spec = h.spec(reconcile={"label": "found"}, side_effect=True, idempotent=False)
    await h.leave_running(spec)

    row = await h.execute(spec)

    assert h.ran == [] and h.reconciled == 1
    assert row.status == "succeeded" and row.output == {"label": "found"}
    assert row.attempts == 1


async def test_reconcile_finding_nothing_reruns(h: Harness) -> None:
    spec = h.spec(reconcile=None, side_effect=True, idempotent=False)
    left = await h.leave_running(spec)

    row = await h.execute(spec)

    assert h.reconciled == 1 and h.ran == [left.idempotency_key]
    assert row.status == "succeeded" and row.attempts == 2
    assert [e.type for e in await h.store.list_events(h.run_id)].count(EventType.ACTION) == 2
    [stopped] = (await result_of(h))["retried"]
    # The code says the attempt ended without an outcome; the message, what was found.
    assert stopped == {
        "attempt": 1,
        "code": "TOOL_OUTCOME_UNKNOWN",
        "message": STOPPED_ATTEMPT + RECONCILED_NO_EFFECT,
    }


async def test_a_reconcile_that_hangs_fails_the_drive_within_the_tools_timeout(
    h: Harness,
) -> None:
    """Rather than holding the run (and its lease, renewed all along) for ever; the row
    stays running for the drive that retries, and the handler has not run again."""
    spec = h.spec(side_effect=True, idempotent=False, timeout_s=0.05)

    async def hangs(args: Args, ctx: ToolContext) -> Any:
        await asyncio.sleep(3600)

    spec = replace(spec, reconcile=hangs)
    await h.leave_running(spec)

    drive = asyncio.ensure_future(h.execute(spec))
    done, _ = await asyncio.wait({drive}, timeout=30)  # a bound on a hang, not a speed
    drive.cancel()
    # Transient, so the drive is retried; never a TimeoutError, which out of a graph is
    # read as the run's time budget running out.
    failed = drive.exception() if drive in done else None
    assert isinstance(failed, ReconcileUnanswered) and not isinstance(failed, TimeoutError)
    assert h.ran == []
    row = await h.store.get_tool_call(h.row(spec).tool_call_id)
    assert row is not None and row.status == "running" and row.attempts == 1


async def test_unreconcilable_side_effect_is_marked_unknown(h: Harness) -> None:
    spec = h.spec(side_effect=True, idempotent=False)
    await h.leave_running(spec)

    row = await h.execute(spec)

    assert h.ran == []
    assert row.status == "unknown"
    assert row.error is not None and row.error["code"] == "TOOL_OUTCOME_UNKNOWN"
    events = await h.store.list_events(h.run_id)
    assert events[-1].type == "result" and events[-1].data["status"] == "unknown"
    assert events[-1].data["error"] == row.error  # the record says why, in both places


# (d): errors -----------------------------------------------------------------------


async def test_unavailable_tool_is_retried_then_failed(h: Harness) -> None:
    spec = h.spec(ToolUnavailable("down"), max_attempts=3)

    row = await h.execute(spec)

    assert len(h.ran) == 3 and len(set(h.ran)) == 1
    assert row.status == "failed" and row.attempts == 3
    assert row.error == {"code": "TOOL_UNAVAILABLE", "message": "down"}


def flaky_spec(h: Harness, faults: list[Exception], **kwargs: Any) -> ToolSpec:
    """A tool that raises each of ``faults`` in turn, then answers."""
    left = list(faults)

    async def handler(args: Args, ctx: ToolContext) -> Any:
        h.ran.append(ctx.idempotency_key)
        if left:
            raise left.pop(0)
        return {"ok": True}

    return ToolSpec("probe", "1", "test tool", Args, handler, **kwargs)


async def result_of(h: Harness) -> dict[str, Any]:
    [result] = [e.data for e in await h.store.list_events(h.run_id) if e.type == "result"]
    return result


async def test_a_retried_call_says_why_each_earlier_attempt_failed(h: Harness) -> None:
    faults: list[Exception] = [ToolUnavailable("503 from the warehouse"), TimeoutError()]
    spec = flaky_spec(h, faults, max_attempts=3, timeout_s=5)

    row = await h.execute(spec)

    assert len(h.ran) == 3 and row.status == "succeeded" and row.attempts == 3
    result = await result_of(h)
    assert result["status"] == "succeeded" and result["error"] is None
    assert result["retried"] == [
        {"attempt": 1, "code": "TOOL_UNAVAILABLE", "message": "503 from the warehouse"},
        {"attempt": 2, "code": "TOOL_UNAVAILABLE", "message": "probe@1 timed out after 5s"},
    ]


async def test_a_call_that_ran_out_of_attempts_says_why_each_failed(h: Harness) -> None:
    spec = flaky_spec(h, [ToolUnavailable(f"down {i}") for i in range(1, 4)], max_attempts=3)

    row = await h.execute(spec)

    assert row.status == "failed" and row.error == {"code": "TOOL_UNAVAILABLE", "message": "down 3"}
    result = await result_of(h)
    assert result["error"] == row.error  # the last: the ledger's
    assert [(r["attempt"], r["message"]) for r in result["retried"]] == [
        (1, "down 1"),
        (2, "down 2"),
    ]


async def test_a_call_run_once_has_no_retries_on_record(h: Harness) -> None:
    row = await h.execute(flaky_spec(h, [], max_attempts=3))

    assert row.status == "succeeded" and "retried" not in await result_of(h)


async def test_retries_are_numbered_after_an_earlier_drives_attempt(h: Harness) -> None:
    spec = flaky_spec(h, [ToolUnavailable("still down")], max_attempts=3, idempotent=True)
    await h.leave_running(spec)  # attempt 1, by a process that died

    row = await h.execute(spec)

    assert row.status == "succeeded" and row.attempts == 3
    assert (await result_of(h))["retried"] == [
        {"attempt": 1, "code": "TOOL_OUTCOME_UNKNOWN", "message": STOPPED_ATTEMPT},
        {"attempt": 2, "code": "TOOL_UNAVAILABLE", "message": "still down"},
    ]


async def cut_off_in_second_attempt(h: Harness, spec: ToolSpec, started: asyncio.Event) -> None:
    """Run ``spec`` until its second attempt has started, then cancel the drive (as a
    user's cancel, the run's time budget or a shutdown does)."""
    drive = asyncio.ensure_future(h.execute(spec))
    await asyncio.wait_for(started.wait(), 30)  # a bound on a hang, not a speed
    drive.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drive


def down_then_hangs(h: Harness, started: asyncio.Event, **kwargs: Any) -> ToolSpec:
    async def handler(args: Args, ctx: ToolContext) -> Any:
        h.ran.append(ctx.idempotency_key)
        if len(h.ran) == 1:
            raise ToolUnavailable("503 from the warehouse")
        if len(h.ran) == 2:
            started.set()
            await asyncio.Event().wait()
        return {"ok": True}

    return ToolSpec("probe", "1", "test tool", Args, handler, max_attempts=3, **kwargs)


async def test_a_call_cut_off_between_retries_keeps_each_attempt_on_record(h: Harness) -> None:
    started = asyncio.Event()
    spec = down_then_hangs(h, started)

    await cut_off_in_second_attempt(h, spec, started)

    # Both attempts counted, and why the first failed, before the second began.
    row = await h.store.get_tool_call(h.row(spec).tool_call_id)
    assert row is not None and row.status == "running" and row.attempts == 2
    assert row.retried == [
        {"attempt": 1, "code": "TOOL_UNAVAILABLE", "message": "503 from the warehouse"}
    ]
    # The run that stops there closes the call with a result that says so.
    await h.store.interrupt_running_calls(h.run_id, Code.RUN_CANCELLED, "cancelled by alice")
    result = await result_of(h)
    assert result["status"] == "cancelled" and [r["attempt"] for r in result["retried"]] == [1]


async def test_a_call_rerun_after_a_crash_between_retries_numbers_every_attempt(
    h: Harness,
) -> None:
    started = asyncio.Event()
    spec = down_then_hangs(h, started, idempotent=True)
    await cut_off_in_second_attempt(h, spec, started)  # the drive dies in attempt 2

    row = await h.execute(spec)  # the next drive

    assert len(h.ran) == 3 and row.status == "succeeded" and row.attempts == 3
    actions = [e.data for e in await h.store.list_events(h.run_id) if e.type == "action"]
    assert [a.get("attempt") for a in actions] == [None, 3]  # the third execution
    assert (await result_of(h))["retried"] == [
        {"attempt": 1, "code": "TOOL_UNAVAILABLE", "message": "503 from the warehouse"},
        {"attempt": 2, "code": "TOOL_OUTCOME_UNKNOWN", "message": STOPPED_ATTEMPT},
    ]


async def cut_off_in_first_backoff(
    h: Harness, spec: ToolSpec, monkeypatch: pytest.MonkeyPatch
) -> ToolCall:
    """Run ``spec`` (failing at first) until its first failure is on record, cancel the
    drive in the backoff after it, and return the row; later backoffs take no time."""
    monkeypatch.setattr(attempts, "BACKOFF_BASE_S", 60.0)  # cut off in the backoff, surely
    drive = asyncio.ensure_future(h.execute(spec))
    tc_id = h.row(spec).tool_call_id
    for _ in range(3000):  # a bound on a hang, not a speed
        row = await h.store.get_tool_call(tc_id)
        if row is not None and row.retried:
            break
        await asyncio.sleep(0.01)
    drive.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drive
    monkeypatch.setattr(attempts, "BACKOFF_BASE_S", 0.0)
    row = await h.store.get_tool_call(tc_id)
    assert row is not None
    return row


async def test_a_call_cut_off_in_its_backoff_keeps_the_failure_on_record(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = flaky_spec(h, [ToolUnavailable("503 first")], max_attempts=3, idempotent=True)
    row = await cut_off_in_first_backoff(h, spec, monkeypatch)

    # The failure was written before the backoff; the next attempt, never started, not.
    assert row.status == "running" and row.attempts == 1
    assert row.retried == [{"attempt": 1, "code": "TOOL_UNAVAILABLE", "message": "503 first"}]
    done = await h.execute(spec)  # the next drive runs it again, after a crash
    assert done.status == "succeeded" and done.attempts == 2 and len(h.ran) == 2
    assert (await result_of(h))["retried"] == row.retried  # not "stopped": its failure is known


async def test_attempts_an_earlier_drive_made_count_against_the_tools_bound(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A takeover does not give a service that is down a new round of calls (a probe
    counted 9 calls of a tool allowed 6, after one crash in a backoff)."""
    faults: list[Exception] = [ToolUnavailable(f"down {i}") for i in range(1, 10)]
    spec = flaky_spec(h, faults, max_attempts=3, idempotent=True)
    await cut_off_in_first_backoff(h, spec, monkeypatch)

    done = await h.execute(spec)

    assert len(h.ran) == 3 and done.attempts == 3
    assert done.status == "failed" and done.error == {
        "code": "TOOL_UNAVAILABLE",
        "message": "down 3",
    }


async def test_a_call_whose_earlier_drives_used_every_attempt_is_tried_once_more(
    h: Harness,
) -> None:
    """The last attempt was cut off: its outcome is unknown, so it is not a failure."""
    faults: list[Exception] = [ToolUnavailable("down")]
    spec = flaky_spec(h, faults, max_attempts=2, idempotent=True)
    row = await h.leave_running(spec)
    await h.store.update_tool_call(row.tool_call_id, attempts=3)  # three drives died in it

    done = await h.execute(spec)

    assert len(h.ran) == 1 and done.attempts == 4
    assert done.status == "failed" and done.error == {"code": "TOOL_UNAVAILABLE", "message": "down"}


async def test_a_run_failing_with_a_call_cut_off_between_retries_keeps_them(h: Harness) -> None:
    """The time budget's end (or a crash loop) closes the calls left running in one
    statement, not through close_call: its result events say the same."""
    started = asyncio.Event()
    spec = down_then_hangs(h, started)
    await cut_off_in_second_attempt(h, spec, started)

    await fail_run(h.store, h.run_id, Code.RUN_BUDGET_EXCEEDED, "time budget of 1 s used up")

    result = await result_of(h)
    assert result["status"] == "cancelled"
    assert result["retried"] == [
        {"attempt": 1, "code": "TOOL_UNAVAILABLE", "message": "503 from the warehouse"}
    ]


async def test_a_humans_rerun_cut_off_lists_only_its_own_attempt(h: Harness) -> None:
    """Attempt 1 was answered by its `unknown` result; a human said "run it again"
    (attempt 2), and that drive died mid-call: the next lists attempt 2 alone."""
    spec = h.spec(reconcile=None, side_effect=True, idempotent=False)
    left = await h.leave_running(spec)
    tc_id = left.tool_call_id
    await h.store.update_tool_call(tc_id, status="unknown", result={"status": "unknown"})
    # What the executor and execute_once(rerun=True) write for the human's ruling.
    await h.store.update_tool_call(
        tc_id, from_status=("unknown",), status="running", retried=[],
        action={"tool_call_id": tc_id, "rerun": True, "attempt": 2},
    )  # fmt: skip
    assert await h.store.claim_tool_call(tc_id, 1) is not None  # ... and the drive died

    row = await h.execute(spec, answered=1)

    assert row.status == "succeeded" and row.attempts == 3 and h.reconciled == 1
    [_, result] = [e.data for e in await h.store.list_events(h.run_id) if e.type == "result"]
    assert [(r["attempt"], r["code"]) for r in result["retried"]] == [(2, "TOOL_OUTCOME_UNKNOWN")]


async def test_a_retried_attempts_message_is_scrubbed_and_bounded(h: Harness) -> None:
    class Secret(BaseModel):
        label: str = "x"
        token: str = "s3cr3t-value"

    async def handler(args: Secret, ctx: ToolContext) -> Any:
        if not h.ran:
            h.ran.append("once")
            raise ToolUnavailable(f"refused {args.token} " + "x" * 5000)
        return {"ok": True}

    spec = ToolSpec(
        "probe", "1", "test tool", Secret, handler, max_attempts=2, secret_args=frozenset({"token"})
    )
    await h.execute(spec, Secret())

    [retry] = (await result_of(h))["retried"]
    assert "s3cr3t-value" not in retry["message"] and retry["message"].startswith("refused ")
    assert len(retry["message"]) < 1000


async def test_business_error_fails_without_retry(h: Harness) -> None:
    spec = h.spec(ToolBusinessError("order already shipped"), max_attempts=3)

    row = await h.execute(spec)

    assert len(h.ran) == 1
    assert row.status == "failed" and row.attempts == 1
    assert row.error == {"code": "TOOL_BUSINESS_ERROR", "message": "order already shipped"}


# (e): large outputs ----------------------------------------------------------------


async def test_large_output_becomes_an_artifact(h: Harness) -> None:
    big = {"rows": ["r" * 100] * (INLINE_OUTPUT_BYTES // 50)}
    spec = h.spec(big)

    row = await h.execute(spec)

    assert row.status == "succeeded" and row.artifact_id is not None
    assert row.output["artifact_id"] == row.artifact_id
    assert row.output["size"] > INLINE_OUTPUT_BYTES and "rows" not in row.output
    stored = await h.store.get_artifact(row.artifact_id)
    assert stored is not None
    assert stored[0].media_type == "application/json" and stored[0].size == row.output["size"]
    events = await h.store.list_events(h.run_id)
    assert [e.type for e in events] == ["state", "action", "artifact", "result"]
    assert events[2].data["artifact_id"] == row.artifact_id
    assert events[3].data["artifact_id"] == row.artifact_id


async def test_small_output_stays_inline(h: Harness) -> None:
    row = await h.execute(h.spec({"ok": True}))
    assert row.output == {"ok": True} and row.artifact_id is None


async def test_output_is_kept_as_its_json_reads_back(h: Harness) -> None:
    """Before, 2**70 was written to the ledger and then failed the run at its checkpoint
    (msgpack holds 64 bits), NaN went into the ledger and artifacts as non-JSON, and a
    lone surrogate failed the ledger write with the call left running: each after the
    tool had run."""
    when = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    output = {
        "big": 2**70,
        "low": -(2**63),
        "when": when,
        "dec": Decimal("1.5"),
        "nan": [float("nan"), float("inf")],
        "text": "half an emoji \ud83d",
        "nul": "a\x00b",  # PostgreSQL's text keeps no NUL: the JSON escapes it
    }
    row = await h.execute(h.spec(output))
    expected = {
        "big": str(2**70),
        "low": -(2**63),
        "when": str(when),
        "dec": "1.5",
        "nan": [None, None],
        "text": "half an emoji \ufffd",
        "nul": "a\x00b",
    }
    assert row.status == "succeeded" and row.output == expected
    stored = await h.store.get_tool_call(row.tool_call_id)
    assert stored is not None and stored.output == expected


async def test_large_output_with_nan_is_a_json_artifact(h: Harness) -> None:
    row = await h.execute(h.spec({"rows": [float("nan")] * INLINE_OUTPUT_BYTES}))
    assert row.artifact_id is not None
    stored = await h.store.get_artifact(row.artifact_id)
    assert stored is not None
    assert json.loads(stored[1], parse_constant=pytest.fail)["rows"][0] is None


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


async def test_a_deeply_nested_output_is_kept_whole_in_an_artifact(h: Harness) -> None:
    """Small but 300 levels deep, it went inline, and the run failed at its checkpoint
    (msgpack stops at 255 levels), after the tool had run."""
    row = await h.execute(h.spec(nested(300)))

    assert row.status == "succeeded" and row.artifact_id is not None
    assert set(row.output) == {"artifact_id", "size", "preview"}
    stored = await h.store.get_tool_call(row.tool_call_id)
    assert stored is not None and stored.output == row.output
    artifact = await h.store.get_artifact(row.artifact_id)
    assert artifact is not None and json.loads(artifact[1]) == nested(300)


def cycle() -> list[Any]:
    looped: list[Any] = []
    looped.append(looped)
    return looped


@pytest.mark.parametrize(
    ("output", "why"),
    [
        (nested(5000), "nests too deep: maximum recursion depth exceeded"),
        (cycle(), "has no JSON form: Circular reference detected"),
        ({(1, 2): "x"}, "has no JSON form: keys must be str"),
    ],
    ids=["past Python's stack", "a cycle", "a tuple key"],
)
async def test_an_output_json_cannot_write_still_closes_the_call(
    h: Harness, output: Any, why: str
) -> None:
    """The call was left running after its side effect, and a later drive would have
    run it again (or called it unknown)."""
    row = await h.execute(h.spec(output))

    assert len(h.ran) == 1 and row.status == "succeeded"
    stored = await h.store.get_tool_call(row.tool_call_id)
    assert stored is not None and stored.status == "succeeded"
    assert stored.output is not None and stored.output["not_kept"].startswith(f"the output {why}")


async def test_an_error_text_no_store_keeps_is_kept_readable(h: Harness) -> None:
    row = await h.execute(h.spec(ToolBusinessError("refused \ud83d by the shop")))
    assert row.status == "failed"
    assert row.error == {"code": "TOOL_BUSINESS_ERROR", "message": "refused \ufffd by the shop"}


# secret args in error text --------------------------------------------------------


def _secret_spec(**kwargs: Any) -> ToolSpec:
    async def handler(args: Args, ctx: ToolContext) -> Any:
        return None

    return ToolSpec("probe", "1", "t", Args, handler, secret_args=frozenset({"label"}), **kwargs)


SPELLINGS = {
    "as text": lambda v: str(ValueError(f"key {v} rejected")),
    "in a repr": lambda v: repr(ValueError(f"key {v} rejected")),
    "in a repr with other quotes": lambda v: repr(ValueError(f'"upstream" said {v}')),
    "in JSON": lambda v: json.dumps({"detail": f"key {v}"}),
}


@pytest.mark.parametrize("spelled", SPELLINGS.values(), ids=SPELLINGS.keys())
@pytest.mark.parametrize(
    "secret", ["p4ss\"wo'rd", "back\\slash", "tab\there", "naïve-ünïcode", "it's-mine"]
)
def test_a_secret_is_scrubbed_however_the_message_spells_it(
    spelled: Callable[[str], str], secret: str
) -> None:
    secrets = secret_values(_secret_spec(), Args(label=secret))

    scrubbed = scrub(spelled(secret), secrets)

    # repr picks its quotes by what the message holds, so those may differ.
    assert scrubbed.replace('"', "'") == spelled(REDACTED).replace('"', "'")


async def test_a_failing_reconcile_does_not_carry_the_secret_out() -> None:
    secret = "hunter2-do-not-show"

    async def reconcile(args: Args, ctx: ToolContext) -> Any:
        raise RuntimeError(f"lookup of {args.label} failed")

    spec = _secret_spec(reconcile=reconcile)
    tctx = ToolContext("run-1", "tc-1", "key", RunContext(), StoreArtifacts(None, None))  # type: ignore[arg-type]
    with pytest.raises(ReconcileFailed) as info:
        await ask_reconcile(spec, Args(label=secret), tctx)

    assert secret not in str(info.value) and REDACTED in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


class Remote:
    """A system whose effect lands a moment after the request, once per key, unless the
    key was voided first (what the demo's publish does with its outbox)."""

    def __init__(self, *, down: bool = False) -> None:
        self.landed: list[str] = []
        self.voided: set[str] = set()
        self.asked: list[bool] = []  # ctx.cut_off of each reconcile
        self.down = down  # reconcile cannot reach it
        self.sent = 0
        self.started = asyncio.Event()

    async def _land(self, key: str) -> None:
        await asyncio.sleep(0.2)
        if key not in self.voided:
            self.landed.append(key)

    def spec(self, fail: Exception | None = None) -> ToolSpec:
        async def handler(args: Args, ctx: ToolContext) -> Any:
            # Out of the handler's reach once sent, as a thread or a request in flight.
            self.sent += 1
            self.started.set()
            asyncio.get_running_loop().create_task(self._land(ctx.idempotency_key))
            if fail is not None:
                raise fail
            await asyncio.sleep(10)

        async def reconcile(args: Args, ctx: ToolContext) -> Any:
            self.asked.append(ctx.cut_off)
            if self.down:
                raise ConnectionError("payments unreachable")
            if ctx.idempotency_key in self.landed:
                return {"landed": True}
            if ctx.cut_off:
                self.voided.add(ctx.idempotency_key)
            return None

        return ToolSpec(
            "pay", "1", "pays", Args, handler, side_effect=True, idempotent=False,
            timeout_s=0.05, reconcile=reconcile,
        )  # fmt: skip


@pytest.mark.parametrize("how", ["timeout", "unavailable"])
async def test_a_call_given_up_on_is_reconciled_as_cut_off(h: Harness, how: str) -> None:
    remote = Remote()
    spec = remote.spec(ToolUnavailable("gateway timeout") if how == "unavailable" else None)

    row = await h.execute(spec)
    await asyncio.sleep(0.3)  # past the moment the effect would land

    # Reconcile was told its answer is final, voided the key, and nothing landed late:
    # the record's "it took no effect" is the truth, and the run lists no side effect.
    assert remote.asked == [True] and remote.landed == []
    assert row.status == "failed" and row.error is not None
    assert row.error["code"] == "TOOL_UNAVAILABLE" and row.error["took_effect"] is False
    assert await side_effects(h.store, h.run_id) == ([], [])


async def test_a_call_given_up_on_that_reconcile_cannot_settle_is_unknown_not_run_again(
    h: Harness,
) -> None:
    """The system is down for reconcile too: the outcome is unknown, and a retried drive
    finds it settled rather than a row still running, which it would run again."""
    remote = Remote(down=True)
    spec = remote.spec()

    first = await h.execute(spec)
    again = await h.execute(spec)
    await asyncio.sleep(0.3)

    assert first.status == again.status == "unknown"
    assert first.error is not None and first.error["code"] == "TOOL_OUTCOME_UNKNOWN"
    # Why nobody can tell is on the record, not only in the server's log.
    assert first.error["message"].endswith(
        "the effect may have happened; asking its reconcile failed: payments unreachable"
    )
    assert remote.sent == 1 and len(remote.landed) == 1
    assert await side_effects(h.store, h.run_id) == ([first.tool_call_id], [])


async def test_a_trial_that_never_reaches_the_tool_lets_the_next_call_try(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The half-open circuit's one trial call met our database failing as it claimed its
    attempt: the handler never ran, and the circuit stayed shut for good (every call of
    the tool in the process "circuit open", however long after)."""
    spec = h.spec()
    breaker = BREAKERS.for_tool(spec.ref)
    breaker.failures = breaker.threshold
    breaker.opened_at = breaker.clock() - breaker.cooldown_s  # the cooldown is over
    claim = h.store.claim_tool_call
    blips = [sqlite3.OperationalError("database is locked")]

    async def claim_in_a_blip(*args: Any) -> ToolCall | None:
        if blips:
            raise blips.pop()
        return await claim(*args)

    monkeypatch.setattr(h.store, "claim_tool_call", claim_in_a_blip)
    with pytest.raises(sqlite3.OperationalError):
        await h.execute(spec)  # the drive fails; the next one runs the call again
    assert h.ran == [] and breaker.state == "half_open"

    done = await h.execute(spec)
    assert done.status == "succeeded" and len(h.ran) == 1, done
    assert breaker.state == "closed"


async def test_a_cancelled_call_whose_reconcile_fails_says_why_it_may_have_taken_effect(
    h: Harness,
) -> None:
    remote = Remote(down=True)
    spec = remote.spec()
    drive = asyncio.ensure_future(h.execute(replace(spec, timeout_s=30)))
    await asyncio.wait_for(remote.started.wait(), 30)  # a bound on a hang, not a speed
    drive.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drive
    row = await h.store.get_tool_call(h.row(spec).tool_call_id)
    assert row is not None and row.status == "running"
    artifacts = StoreArtifacts(h.store, h.run_id)
    tctx = ToolContext(h.run_id, row.tool_call_id, row.idempotency_key, RunContext(), artifacts)
    error = {"code": Code.RUN_CANCELLED, "message": "cancelled by alice"}

    for _ in range(2):  # a cancel's pass retried after a blip asks again
        assert await settle_cut_off(h.store, spec, row, Args(), tctx, error) is None

    assert remote.asked == [True, True]
    # Left running for the cancel's end (or a retried pass) to settle; why nobody can
    # tell is on the record, once.
    still = await h.store.get_tool_call(row.tool_call_id)
    assert still is not None and still.status == "running"
    [said] = [e.data for e in await h.store.list_events(h.run_id) if e.type == "error"]
    assert said == {
        "code": "TOOL_OUTCOME_UNKNOWN",
        "message": "pay@1 was cut off mid-call; asking its reconcile failed: payments unreachable",
        "tool_call_id": row.tool_call_id,
        "recovery": "human",
    }
