"""A compensation that ran to its end is recorded as done through a database blip, and
is not run a second time by the cancel's next drive when the write fails for longer:
the next drive's claim (one per lease) used to take it again and run it again, a
second refund under a key a payment system may not know to deduplicate.

The database's failure is injected into the store's one write of "done" (the blip
fixtures cannot aim at one statement of a drive)."""

from __future__ import annotations

import psycopg
import pytest
from pydantic import BaseModel

from runtime.cancelling import CallSetting, finish_cancel
from runtime.store.base import RunStore
from runtime.tooling import ToolContext, ToolSpec
from tests.unit.conftest import MakeRun
from tests.unit.test_fail_run import NoArgs, leased_with_an_effect, noop
from tests.unit.test_fencing import store_of
from tools.registry import ToolRegistry


def failing_done(view: RunStore, times: int) -> None:
    """The view's first ``times`` writes of a compensation done fail as a blip would."""
    real = view.release_compensation
    left = [times]

    async def release(tool_call_id: str, *, done: bool) -> None:
        if done and left[0] > 0:
            left[0] -= 1
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        await real(tool_call_id, done=done)

    view.release_compensation = release  # type: ignore[method-assign]


@pytest.mark.parametrize("blip", ["passes", "outlasts the drive"])
async def test_a_compensation_that_ran_runs_once(
    backend: object, make_run: MakeRun, blip: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_of(backend)
    run, view, row = await leased_with_an_effect(store, make_run)
    undone: list[str] = []

    async def undo(args: BaseModel, output: object, ctx: ToolContext) -> None:
        undone.append(ctx.idempotency_key)  # a refund issued

    spec = ToolSpec("noop", "1", "noop", NoArgs, noop, side_effect=True, compensate=undo)
    setting = CallSetting(ToolRegistry([spec]))
    if blip == "passes":
        failing_done(view, times=2)
        await finish_cancel(view, lambda _: setting, run.run_id, "stop", compensate=True)
    else:
        failing_done(view, times=10**6)
        monkeypatch.setattr("runtime.cancelling.WITHOUT_LEASE_S", 0.2)  # tried that long
        with pytest.raises(psycopg.OperationalError):  # the drive ends on it, handed back
            await finish_cancel(view, lambda _: setting, run.run_id, "stop", compensate=True)
        await store.release_lease(run.run_id, "w1", 1, needs_drive=None, retry_in=0.0)
        version = await store.take_lease(run.run_id, "w1", 30.0)  # this process's next drive
        assert version is not None
        again = store.fenced(run.run_id, version)
        await finish_cancel(again, lambda _: setting, run.run_id, "stop", compensate=True)

    final = await store.get_run(run.run_id)
    assert final is not None and final.outcome is not None
    assert undone == [row.idempotency_key]
    assert final.outcome.compensations == [row.tool_call_id]
    [call] = await store.list_tool_calls(run.run_id)
    assert call.compensated
