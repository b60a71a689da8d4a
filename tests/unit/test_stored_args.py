"""A call's args as stored that no longer validate against its tool's model (the tool
changed its args since): whatever fails on them says what is wrong by field, never a
value, a secret argument's among them (a validation error's text quotes its input)."""

from __future__ import annotations

import traceback

import pytest
from pydantic import BaseModel, ConfigDict

from runtime.cancelling import CallSetting, compensate_effects
from runtime.model import ToolCall, utcnow
from runtime.store.sqlite import SqliteRunStore
from runtime.tooling import ToolContext, ToolSpec
from tests.unit.conftest import MakeRun
from tools.registry import ToolRegistry

SECRET = "sk-live-0123456789"


class PayArgs(BaseModel):
    """The tool's args now: ``amount`` added since the call was stored."""

    model_config = ConfigDict(extra="forbid")
    api_key: str
    amount: int


async def pay(args: BaseModel, ctx: ToolContext) -> dict[str, object]:
    return {}


async def refund(args: BaseModel, output: object, ctx: ToolContext) -> None:
    return None


async def test_a_compensation_of_args_that_no_longer_validate_never_quotes_them(
    sqlite_store: SqliteRunStore, make_run: MakeRun
) -> None:
    spec = ToolSpec(
        "pay",
        "1",
        "Pay.",
        PayArgs,
        pay,
        side_effect=True,
        idempotent=False,
        compensate=refund,
        secret_args=frozenset({"api_key"}),
    )
    run = await make_run(sqlite_store)
    now = utcnow()
    row = ToolCall(
        tool_call_id="tc-1",
        run_id=run.run_id,
        step_index=0,
        call_index=0,
        tool="pay",
        version="1",
        args={"api_key": SECRET},  # as an earlier version of the tool took them
        args_hash="h",
        status="running",
        idempotency_key="k",
        attempts=1,
        side_effect=True,
        created_at=now,
        updated_at=now,
    )
    await sqlite_store.begin_tool_call(row, {"tool": "pay"})
    await sqlite_store.update_tool_call("tc-1", status="succeeded", output={"ok": True})
    with pytest.raises(ValueError, match="amount: Field required") as raised:
        await compensate_effects(sqlite_store, CallSetting(ToolRegistry([spec])), run)
    printed = "".join(traceback.format_exception(raised.value))  # as a log's traceback
    assert "pay@1: its stored args no longer validate" in printed
    assert SECRET not in printed
