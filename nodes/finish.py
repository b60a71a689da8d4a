"""The finish node: the terminal check. "The model says it is done" is only a proposal."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime

from runtime.context import Context, services
from runtime.errors import CODES, Code
from runtime.events import EventType
from runtime.ids import HANDOFF_PREFIX
from runtime.model import Decision
from runtime.state import RunState

NodeFn = Any


async def terminal_problems(state: RunState, ctx: Context) -> list[str]:
    problems = []
    if state.get("calls"):
        problems.append("tool calls are still queued")
    if await ctx.store.list_approvals(run_id=ctx.run_id, status="pending", limit=1):
        problems.append("an approval is still open")
    for row in await ctx.store.list_tool_calls(ctx.run_id):
        if row.status == "running":
            problems.append(f"tool call {row.tool_call_id} is still running")
        if row.artifact_id and not await ctx.store.artifact_exists(row.artifact_id):
            problems.append(f"artifact {row.artifact_id} is not stored")
    return problems


def artifacts_of(observations: list[dict[str, Any]]) -> list[str]:
    """The artifacts an agent's work made: its calls', and those its sub-agents handed
    back (a handback names one as ``artifact_id`` only when it is the only one)."""
    made = {str(o["artifact_id"]) for o in observations if o.get("artifact_id")}
    for o in observations:
        output = o.get("output")
        handback = str(o.get("tool_call_id", "")).startswith(HANDOFF_PREFIX)  # not a tool's
        if handback and isinstance(output, dict):
            made.update(str(a) for a in output.get("artifacts") or [])
    return sorted(made)


def refusal(state: RunState, problems: list[str]) -> dict[str, Any]:
    """The observation a refused finish leaves for the planner: why it may not end yet."""
    return {
        "step_index": state["step_index"],
        "tool_call_id": "",
        "tool": "finish",
        "status": Code.FINISH_REFUSED.value,
        "summary": "; ".join(problems),
        "error": "; ".join(problems),
    }


async def record_refusal(ctx: Context, step: int, problems: list[str]) -> None:
    """On the run's log too: a step that proposed to finish, followed by another, is
    explained there (an auditor does not read the planner's observations)."""
    await ctx.store.append_event(
        ctx.run_id,
        EventType.ERROR,
        {
            "code": Code.FINISH_REFUSED,
            "message": "; ".join(problems),
            "step_index": step,
            "recovery": CODES[Code.FINISH_REFUSED].recovery,
        },
        dedupe_key=f"finish-refused:{step}",  # the node may run again on a resume
    )


def make_finish_node() -> NodeFn:
    async def finish_node(state: RunState, runtime: Runtime[Context]) -> dict[str, Any]:
        ctx = await services(runtime, state)
        decision = Decision.model_validate(state["decision"])
        problems = await terminal_problems(state, ctx)
        if problems:
            await record_refusal(ctx, state["step_index"], problems)
            return {
                "observations": [refusal(state, problems)],
                "memory_version": state.get("memory_version", 0) + 1,
            }
        artifacts = artifacts_of(state.get("observations", []))
        return {
            "result": {
                "answer": decision.answer,
                "summary": decision.summary,
                "data": decision.data,
                "artifacts": artifacts,
            },
            "outcome": {"status": "succeeded", "code": None, "message": ""},
        }

    return finish_node
