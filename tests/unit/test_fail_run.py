"""Failing a run where something else moves at the same time: a human's approval (it
moves the run without the lease), or a shutdown cutting a cancel's compensation short."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from runtime import ids
from runtime.adapter import fail_run
from runtime.cancelling import CallSetting, CutOff, cut_off_usage, finish_cancel
from runtime.errors import Code, call_error_key
from runtime.events import EventType
from runtime.lifecycle import State
from runtime.model import Decision, ProposedCall, Run, Step, ToolCall, Usage, utcnow
from runtime.store.base import RunStore
from runtime.tooling import ToolContext, ToolSpec
from tests.unit.conftest import MakeRun
from tests.unit.test_fencing import ledger_row, store_of
from tests.unit.test_store import pending_approval
from tools.registry import ToolRegistry


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


async def noop(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
    return {}


class DecidedAfterRead:
    """A drive's store view; a human approves right after the view's first read of the run."""

    def __init__(self, view: RunStore, base: RunStore, approval_id: str) -> None:
        self.view, self.base, self.approval_id = view, base, approval_id
        self.decided = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.view, name)

    async def get_run(self, run_id: str) -> Run | None:
        run = await self.view.get_run(run_id)
        if not self.decided:
            self.decided = True
            await self.base.decide_approval(
                self.approval_id, "approved", decided_by="u-mgr", comment=None
            )
        return run


async def test_a_cancel_racing_an_approval_still_ends_cancelled(
    backend: object, make_run: MakeRun
) -> None:
    store = store_of(backend)
    run = await make_run(store, state=State.EXECUTING)
    version = await store.take_lease(run.run_id, "w1", 30.0)
    assert version is not None
    view = store.fenced(run.run_id, version)
    approval = pending_approval(run.run_id, "ap-race")
    await store.ensure_approval(approval, {"approval_id": approval.approval_id})
    await view.park(run.run_id, approval.approval_id, State.EXECUTING)

    racing: Any = DecidedAfterRead(view, store, approval.approval_id)
    final = await fail_run(racing, run.run_id, Code.RUN_CANCELLED, "stop")

    assert racing.decided
    assert final is not None and final.state is State.FAILED
    assert final.outcome is not None and final.outcome.code is Code.RUN_CANCELLED
    states = [e.data["to"] for e in await store.list_events(run.run_id) if e.type == "state"]
    assert states[-3:] == ["waiting_human", "executing", "failed"]
    errors = [e.data["code"] for e in await store.list_events(run.run_id) if e.type == "error"]
    assert errors == ["RUN_CANCELLED"]


async def leased_with_an_effect(
    store: RunStore, make_run: MakeRun
) -> tuple[Run, RunStore, ToolCall]:
    """A run under a drive's lease (its view) whose one side effect has succeeded."""
    run = await make_run(store, state=State.EXECUTING)
    version = await store.take_lease(run.run_id, "w1", 30.0)
    assert version is not None
    view = store.fenced(run.run_id, version)
    row, _ = await view.start_tool_call(ledger_row(run.run_id), {"tool": "noop"})
    await view.update_tool_call(row.tool_call_id, result=None, status="succeeded")
    return run, view, row


async def test_a_compensation_cut_short_runs_again_in_the_same_drive(
    backend: object, make_run: MakeRun
) -> None:
    """A drive finishing a cancel is stopped mid-compensation (a shutdown) and finishes
    the cancel again (its CancelledError path): its claim, one per lease, had kept the
    compensation from running a second time, and the run ended uncompensated."""
    store = store_of(backend)
    run, view, row = await leased_with_an_effect(store, make_run)
    undone: list[str] = []
    entered = asyncio.Event()

    async def undo(args: BaseModel, output: object, ctx: ToolContext) -> None:
        entered.set()
        await asyncio.sleep(0.2)
        undone.append(ctx.idempotency_key)

    spec = ToolSpec("noop", "1", "noop", NoArgs, noop, side_effect=True, compensate=undo)
    setting = CallSetting(ToolRegistry([spec]))
    first = asyncio.create_task(
        finish_cancel(view, lambda _: setting, run.run_id, "stop", compensate=True)
    )
    await entered.wait()
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first

    await finish_cancel(view, lambda _: setting, run.run_id, "stop", compensate=True)

    final = await store.get_run(run.run_id)
    assert final is not None and final.outcome is not None
    assert final.outcome.compensations == [row.tool_call_id]
    assert undone == [row.idempotency_key]
    assert (await store.get_tool_call(row.tool_call_id)).compensated  # type: ignore[union-attr]


async def test_a_step_recorded_before_the_cut_is_in_the_usage(
    backend: object, make_run: MakeRun
) -> None:
    """The planner records its step, then its node returns the count: a cut in between
    left the step on the record and out of the usage."""
    store = store_of(backend)
    run = await make_run(store)
    await store.record_step(
        Step(
            run_id=run.run_id,
            step_index=0,
            decision=Decision(kind="finish", answer="x"),
            started_at=utcnow(),
        )
    )
    before = {"usage": Usage(steps=0, active_s=1.5).model_dump()}

    charged = await cut_off_usage(store, run, CutOff(before, active_s=2.0))

    assert charged["steps"] == 1 and charged["active_s"] == 2.0


async def test_compensation_asked_by_a_second_cancel_is_done(
    backend: object, make_run: MakeRun
) -> None:
    """The drive read the first cancel's intent (no compensation); a second cancel asked
    for it before the drive got there: it was merged in the store and never done."""
    store = store_of(backend)
    run, view, row = await leased_with_an_effect(store, make_run)
    undone: list[str] = []

    async def undo(args: BaseModel, output: object, ctx: ToolContext) -> None:
        undone.append(ctx.idempotency_key)

    spec = ToolSpec("noop", "1", "noop", NoArgs, noop, side_effect=True, compensate=undo)
    setting = CallSetting(ToolRegistry([spec]))
    assert await store.request_cancel(run.run_id, "stop", compensate=False, requested_by="u1")
    reason, compensate = await view.cancel_requested(run.run_id) or ("", True)
    assert await store.request_cancel(run.run_id, "and undo it", True, requested_by="adm")

    await finish_cancel(view, lambda _: setting, run.run_id, reason, compensate)

    final = await store.get_run(run.run_id)
    assert final is not None and final.outcome is not None
    assert final.outcome.compensations == [row.tool_call_id] and undone == [row.idempotency_key]
    # And the outcome says who asked for the compensation that ran.
    assert final.outcome.message == "stop (requested by u1); compensation asked for by adm"


async def test_a_cut_charges_calls_started_once_and_a_re_run_not_again(
    backend: object, make_run: MakeRun
) -> None:
    """A call a human sent back to run again after an unknown outcome was charged when
    it first ran: cut off in its re-run, it is not charged a second time."""
    store = store_of(backend)
    run = await make_run(store)
    rows = [
        ledger_row(run.run_id).model_copy(update={"tool_call_id": f"tc-{i}", "call_index": i})
        for i in range(3)
    ]
    for row in rows[:2]:
        await store.start_tool_call(row, {})  # started: attempts 1
    await store.claim_tool_call(rows[1].tool_call_id, 1)  # run again: attempts 2
    calls = [
        {"tool_call_id": "tc-0"},  # started in the cut step: charged
        {"tool_call_id": "tc-1", "kind": "outcome_unknown", "unknown_after_attempts": 1},
        {"tool_call_id": "tc-2"},  # never started: not charged
    ]
    before = {"usage": Usage(tool_calls=4).model_dump(), "calls": calls}

    charged = await cut_off_usage(store, run, CutOff(before))

    assert charged["tool_calls"] == 5


async def test_a_run_ending_mid_step_says_which_proposed_calls_did_not_run(
    backend: object, make_run: MakeRun
) -> None:
    """A cancel while a step's call waits for its approval, or right after a human
    approved it: the step's calls that never reached the ledger were explained nowhere.
    Each gets its CALL_NOT_RUN, but for those something explains already: one that ran,
    one refused (its keyed error), one a human rejected, the one the failure names."""
    store = store_of(backend)
    run = await make_run(store, state=State.EXECUTING)
    tools = ["counter", "wire", "ran", "refused", "rejected", "named"]
    step = Decision(kind="tool_calls", tool_calls=[ProposedCall(tool=t, args={}) for t in tools])
    await store.record_step(
        Step(run_id=run.run_id, step_index=0, decision=step, started_at=utcnow())
    )
    tc = [ids.tool_call_id(run.run_id, 0, i) for i in range(len(tools))]
    ran = ledger_row(run.run_id).model_copy(update={"tool_call_id": tc[2], "call_index": 2})
    await store.start_tool_call(ran, {"tool": "ran"})
    await store.append_event(
        run.run_id,
        EventType.ERROR,
        {"code": "TOOL_ARGUMENT_INVALID", "tool_call_id": tc[3]},
        dedupe_key=call_error_key(tc[3]),
    )
    decisions: list[tuple[int, Literal["approved", "rejected"]]] = [
        (1, "approved"),
        (4, "rejected"),
    ]
    for i, status in decisions:
        asked = pending_approval(run.run_id, f"ap-{i}").model_copy(update={"tool_call_id": tc[i]})
        await store.ensure_approval(asked, {})
        await store.decide_approval(asked.approval_id, status, decided_by="u-mgr", comment=None)

    final = await fail_run(store, run.run_id, Code.RUN_CANCELLED, "stop", tool_call_id=tc[5])

    assert final is not None and final.state is State.FAILED
    errors = [e.data for e in await store.list_events(run.run_id) if e.type == "error"]
    not_run = [(e["tool_call_id"], e["recovery"]) for e in errors if e["code"] == "CALL_NOT_RUN"]
    assert not_run == [(tc[0], "none"), (tc[1], "none")]
    assert errors[-1]["code"] == "RUN_CANCELLED"
    assert "not run: the run ended (RUN_CANCELLED)" in errors[-2]["message"]
