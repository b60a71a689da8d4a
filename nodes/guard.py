"""The guard node: nothing runs before its tool, version, schema, policy and budget pass.

Argument errors and unknown tools go back to the planner as observations (a
replan, bounded by the step budget), and so does a policy denial of a tool whose
``on_deny`` is "replan"; any other denial, or an exhausted budget, ends the run.
"""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime
from pydantic import ValidationError

from nodes.not_run import in_call_order, not_run
from runtime import ids
from runtime.budget import before_tools, limits_from
from runtime.context import Context, services
from runtime.errors import CODES, Code, Recovery, call_error, call_error_key
from runtime.events import EventType
from runtime.ids import proposed_calls
from runtime.model import Decision, Usage
from runtime.policy import Policy
from runtime.state import RunState, failed, run_context
from runtime.tooling import ToolResolver

NodeFn = Any


def _validation_message(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'args'}: {err['msg']}" for err in exc.errors()
    )


async def _refused(ctx: Context, refusal: dict[str, Any]) -> None:
    await ctx.store.append_event(
        ctx.run_id, EventType.ERROR, refusal, dedupe_key=call_error_key(refusal["tool_call_id"])
    )


def make_guard_node(tools: ToolResolver, policy: Policy) -> NodeFn:
    async def guard_node(state: RunState, runtime: Runtime[Context]) -> dict[str, Any]:
        ctx = await services(runtime, state)
        decision = Decision.model_validate(state["decision"])
        step = state["step_index"]
        context = run_context(state)
        calls: list[dict[str, Any]] = []
        rejected: list[dict[str, Any]] = []
        refusals: list[dict[str, Any]] = []  # their error events, written once all are seen
        stop: dict[str, Any] | None = None  # a denial that ends the run
        denied = ""
        for index, proposed in enumerate(decision.tool_calls):
            tc_id = ids.tool_call_id(ctx.run_id, step, index)
            spec = tools.resolve(proposed.tool, proposed.version)
            code, message, recovery = None, "", None
            if spec is None:
                wanted = proposed.tool + (f"@{proposed.version}" if proposed.version else "")
                code, message = Code.TOOL_NOT_FOUND, f"no tool {wanted}"
            else:
                try:
                    args = spec.args_model.model_validate(proposed.args)
                except ValidationError as exc:
                    code, message = Code.TOOL_ARGUMENT_INVALID, _validation_message(exc)
                else:
                    verdict = policy.decide(spec, args, context)
                    if verdict.action == "deny" and spec.on_deny == "replan":
                        code, message = Code.POLICY_DENIED, verdict.reason
                        recovery = Recovery.REPLAN  # the planner takes another path
                    elif verdict.action == "deny":
                        # The run stops: its end writes the one error event, naming the call.
                        stop = failed(Code.POLICY_DENIED, verdict.reason, tool_call_id=tc_id)
                        denied = f"{proposed.tool} {tc_id}"
                        break
                    else:
                        normalized = args.model_dump(mode="json")
                        calls.append(
                            {
                                "tool_call_id": tc_id,
                                "call_index": index,
                                "tool": spec.name,
                                "version": spec.version,
                                "args": normalized,
                                "args_hash": ids.content_hash(normalized),
                                "needs_approval": verdict.action == "approve",
                                "reason": verdict.reason,
                            }
                        )
            if code is not None:
                rejected.append(
                    {
                        "step_index": step,
                        "tool_call_id": tc_id,
                        "tool": proposed.tool,
                        "status": code.value,
                        "error": message,
                        "summary": message,
                    }
                )
                where = {"tool_call_id": tc_id, "call_index": index}
                recovery = recovery or CODES[code].recovery
                refusals.append(call_error(code, where, step, message, recovery))
        if stop is not None:
            # Nothing is replanned (a refusal before the denial said "replan", and the
            # rest of the step nothing): each refused call says why, with nothing to
            # recover, and every other one, those after the denied one too, is not run.
            for refusal in refusals:
                await _refused(ctx, {**refusal, "recovery": Recovery.NONE})
            told = {r["tool_call_id"] for r in refusals} | {stop["tool_call_id"]}
            proposals = proposed_calls(ctx.run_id, step, decision)
            others = [c for c in proposals if c["tool_call_id"] not in told]
            await not_run(ctx, step, others, f"the denial of {denied}", ended=True)
            return {"outcome": stop, "calls": []}
        for refusal in refusals:
            await _refused(ctx, refusal)
        if rejected:
            # The step runs whole or not at all: the planner sees every problem at once,
            # and which of its calls did not run for them.
            why = ", ".join(f"{r['tool']} {r['tool_call_id']}" for r in rejected)
            dropped = await not_run(ctx, step, calls, f"the refusal of {why}")
            return {
                "calls": [],
                "observations": in_call_order(
                    rejected + dropped, proposed_calls(ctx.run_id, step, decision)
                ),
                "memory_version": state.get("memory_version", 0) + 1,
            }
        usage = Usage.model_validate(state.get("usage") or {})
        over = before_tools(usage, limits_from(state.get("limits")), len(calls), ctx.active_s())
        if over:
            await not_run(ctx, step, calls, f"the budget ({over})", ended=True)
            return {"outcome": failed(Code.RUN_BUDGET_EXCEEDED, over), "calls": []}
        return {"calls": calls}

    return guard_node
