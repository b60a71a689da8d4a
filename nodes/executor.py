"""The executor node: runs the step's approved tool calls through the ledger, once each."""

from __future__ import annotations

import asyncio
from typing import Any

from langgraph.runtime import Runtime

from runtime import failpoints
from runtime.context import Context, services
from runtime.errors import Code
from runtime.events import summarize
from runtime.ids import call_approval_id
from runtime.ledger import StoreArtifacts, execute_once, new_ledger_row
from runtime.memory import Memory
from runtime.model import ToolCall, Usage
from runtime.state import RunState, failed, run_context
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


def resolution_call(call: dict[str, Any], row: ToolCall) -> dict[str, Any]:
    """The call again, now waiting on a human's word about its unknown outcome."""
    # Why it is unknown is the ledger's to say: a drive that stopped before recording
    # it (the process, or the database), a timeout, a handler that gave up. Bounded and
    # quoted: a handler's or a remote system's text, not the runtime's own words.
    why = summarize((row.error or {}).get("message") or "it was not recorded")
    return {
        **call,
        "kind": "outcome_unknown",
        "needs_approval": True,
        "approval_key": f"{row.tool_call_id}:outcome:{row.attempts}",
        "unknown_after_attempts": row.attempts,
        "reason": (
            f"the outcome of {row.tool}@{row.version} {row.tool_call_id} is unknown; the "
            f"ledger says {why!r}. Approve to run it again with the same idempotency key; "
            "reject if it already took effect."
        ),
    }


def make_executor_node(tools: ToolResolver) -> NodeFn:
    async def executor_node(state: RunState, runtime: Runtime[Context]) -> dict[str, Any]:
        ctx = await services(runtime, state)
        context = run_context(state)
        artifacts = StoreArtifacts(ctx.store, ctx.run_id)
        memory = None
        if runtime.store is not None:
            memory = Memory.for_tool(runtime.store, context.tenant_id, context.user_id)

        async def run_call(call: dict[str, Any]) -> ToolCall:
            spec = tools.resolve(call["tool"], call["version"])
            assert spec is not None, "the guard resolved this tool"
            if call["needs_approval"]:
                approval = await ctx.store.get_approval(call_approval_id(call))
                if (
                    approval is None
                    or approval.status != "approved"
                    or (approval.args_hash != call["args_hash"])
                ):
                    raise RuntimeError(f"{call['tool_call_id']} has no matching approval")
            args = spec.stored_args(call["args"])
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
                memory=memory,
            )
            action = {
                "tool_call_id": row.tool_call_id,
                "tool": spec.name,
                "version": spec.version,
                "args": summarize(spec.redact(call["args"])),
                "idempotency_key": row.idempotency_key,
            }
            rerun = False
            if call.get("kind") == "outcome_unknown":
                # A human said "run it again". Only the episode they were asked about:
                # if that re-run itself was cut short, its outcome is unknown anew.
                current = await ctx.store.get_tool_call(row.tool_call_id)
                if current is not None and current.status == "unknown":
                    # The log shows it run again: a second action, answered by a result.
                    # Its attempts so far were answered by the `unknown` result: the
                    # re-run's own result lists only its own.
                    await ctx.store.update_tool_call(
                        row.tool_call_id,
                        from_status=("unknown",),
                        status="running",
                        error=None,
                        retried=[],
                        action={**action, "rerun": True, "attempt": current.attempts + 1},
                    )
                    rerun = True
                elif current is not None and current.status == "running":
                    rerun = current.attempts == call["unknown_after_attempts"]
            return await execute_once(
                ctx.store,
                spec,
                row,
                args,
                tctx,
                action,
                rerun=rerun,
                recording=ctx.recording,
                answered=int(call.get("unknown_after_attempts") or 0),
            )

        calls = state.get("calls", [])
        # Every call is seen to its end before a failure propagates: none is left
        # running unsupervised behind a run that already ended.
        settled = await asyncio.gather(*(run_call(c) for c in calls), return_exceptions=True)
        for outcome in settled:
            if isinstance(outcome, BaseException):
                raise outcome
        rows = [r for r in settled if isinstance(r, ToolCall)]
        usage = Usage.model_validate(state.get("usage") or {})
        # A call is charged once, when first run: one a human sends back to run again
        # after an unknown outcome was charged then (as a re-run after a crash is).
        charged = sum(1 for c in calls if c.get("kind") != "outcome_unknown")
        update: dict[str, Any] = {
            "calls": [],
            "observations": [observation(r) for r in rows],
            "tool_calls": [r.tool_call_id for r in rows],
            "usage": usage.model_copy(
                update={
                    "tool_calls": usage.tool_calls + charged,
                    "active_s": ctx.active_s(),
                }
            ).model_dump(),
            "memory_version": state.get("memory_version", 0) + 1,
        }
        for row in rows:
            failpoints.hit("ledger.after", row.tool)
        for row in rows:
            code = (row.error or {}).get("code")
            if row.status not in ("succeeded", "unknown") and code not in REPLANNABLE:
                # Whatever else the step holds: a call of it whose outcome is unknown
                # is not asked about (it was, and the failure was lost once a human had
                # ruled), but listed with the effects that may have happened.
                update["outcome"] = failed(
                    str(code or Code.TOOL_FAILED),
                    f"{row.tool} {row.tool_call_id}: "
                    + str((row.error or {}).get("message", row.status)),
                    tool_call_id=row.tool_call_id,
                )
                return update
        unknown = [r for r in rows if r.status == "unknown"]
        if unknown:
            # Never guess: a human decides whether each such call runs again.
            by_id = {c["tool_call_id"]: c for c in calls}
            update["calls"] = [resolution_call(by_id[r.tool_call_id], r) for r in unknown]
            update["observations"] = [observation(r) for r in rows if r.status != "unknown"]
            update["tool_calls"] = [r.tool_call_id for r in rows if r.status != "unknown"]
        return update

    return executor_node
