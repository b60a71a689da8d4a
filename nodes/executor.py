"""The executor node: runs the step's approved tool calls through the ledger, once each."""

from __future__ import annotations

import asyncio
from typing import Any

from langgraph.runtime import Runtime

from runtime.context import Context
from runtime.errors import Code
from runtime.events import summarize
from runtime.ledger import StoreArtifacts, execute_once, new_ledger_row
from runtime.model import RunContext, ToolCall, Usage
from runtime.state import RunState, failed
from runtime.tooling import ToolContext, ToolResolver

NodeFn = Any

# Errors the planner can act on; every other failed call ends the run.
REPLANNABLE = {Code.TOOL_BUSINESS_ERROR.value}


def observation(row: ToolCall) -> dict[str, Any]:
    error = row.error or {}
    return {
        "step_index": row.step_index,
        "tool_call_id": row.tool_call_id,
        "tool": row.tool,
        "status": row.status if row.status == "succeeded" else str(error.get("code", row.status)),
        "summary": summarize(row.output if row.status == "succeeded" else error.get("message")),
        "output": row.output if row.status == "succeeded" else None,
        "artifact_id": row.artifact_id,
        "error": error.get("message"),
    }


def make_executor_node(tools: ToolResolver) -> NodeFn:
    async def executor_node(state: RunState, runtime: Runtime[Context]) -> dict[str, Any]:
        ctx = runtime.context
        context = RunContext.model_validate(state.get("context") or {})
        artifacts = StoreArtifacts(ctx.store, ctx.run_id)

        async def run_call(call: dict[str, Any]) -> ToolCall:
            spec = tools.resolve(call["tool"], call["version"])
            assert spec is not None, "the guard resolved this tool"
            if call["needs_approval"]:
                from runtime.ids import approval_id

                approval = await ctx.store.get_approval(approval_id(call["tool_call_id"]))
                if (
                    approval is None
                    or approval.status != "approved"
                    or (approval.args_hash != call["args_hash"])
                ):
                    raise RuntimeError(f"{call['tool_call_id']} has no matching approval")
            args = spec.args_model.model_validate(call["args"])
            row = new_ledger_row(
                ctx.run_id,
                state["step_index"],
                call["call_index"],
                call["tool_call_id"],
                spec,
                call["args"],
                call["args_hash"],
            )
            tctx = ToolContext(
                run_id=ctx.run_id,
                tool_call_id=row.tool_call_id,
                idempotency_key=row.idempotency_key,
                context=context,
                artifacts=artifacts,
            )
            action = {
                "tool_call_id": row.tool_call_id,
                "tool": spec.name,
                "version": spec.version,
                "args": summarize(call["args"]),
                "idempotency_key": row.idempotency_key,
            }
            return await execute_once(ctx.store, spec, row, args, tctx, action)

        calls = state.get("calls", [])
        # Every call is seen to its end before a failure propagates: none is left
        # running unsupervised behind a run that already ended.
        settled = await asyncio.gather(*(run_call(c) for c in calls), return_exceptions=True)
        for outcome in settled:
            if isinstance(outcome, BaseException):
                raise outcome
        rows = [r for r in settled if isinstance(r, ToolCall)]
        usage = Usage.model_validate(state.get("usage") or {})
        update: dict[str, Any] = {
            "calls": [],
            "observations": [observation(r) for r in rows],
            "tool_calls": [r.tool_call_id for r in rows],
            "usage": usage.model_copy(
                update={
                    "tool_calls": usage.tool_calls + len(rows),
                    "active_s": ctx.active_s(),
                }
            ).model_dump(),
            "memory_version": state.get("memory_version", 0) + 1,
        }
        for row in rows:
            code = (row.error or {}).get("code")
            if row.status != "succeeded" and code not in REPLANNABLE:
                update["outcome"] = failed(
                    str(code or Code.TOOL_FAILED),
                    f"{row.tool} {row.tool_call_id}: "
                    + str((row.error or {}).get("message", row.status)),
                )
                break
        return update

    return executor_node
