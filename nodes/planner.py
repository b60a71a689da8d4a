"""The planner node: asks the agent's planner for the next structured decision.

A decision is recorded as a Step before anything acts on it; when LangGraph
replays this node after a restart, the recorded decision is used again rather
than asking the planner (an LLM may answer differently the second time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langgraph.runtime import Runtime

from nodes.not_run import not_run
from runtime.budget import after_plan, before_plan, counted, limits_from
from runtime.context import Context, services
from runtime.errors import Code
from runtime.ids import proposed_calls
from runtime.model import Decision, DecisionUsage, Step, Usage, utcnow
from runtime.planner import Observation, Planner, PlannerView, spent_of
from runtime.state import RunState, failed, run_context
from runtime.storable import MAX_NESTING, nests_deeper, plain_json
from runtime.tooling import ToolResolver

NodeFn = Any


def thread_taken(state: RunState) -> str | None:
    """Why a new input may not start planning on this thread: a thread is one run.

    Only a LangGraph server (Studio, ``langgraph dev``) can get here: it applies an
    input sent to a thread whose run has ended, or waits for a human, and starts at
    the planner again. Planned on, an ended run's old answer stood under the new
    question, and a parked step's approval was orphaned while its run went on (and
    could still be approved from a fork: a second publish). The runtime's own drives
    send an input only to a run with no checkpoint."""
    outcome = state.get("outcome")
    if outcome:
        return (
            f"this thread's run has ended ({outcome.get('status')}): a thread is one run, "
            "start a new thread for a new input"
        )
    if state.get("calls"):  # a step's calls not yet run: only where a human is asked
        return (
            "this thread's run waits for a human's decision on its step, and a thread is "
            "one run: the new input is refused. Resume the checkpoint that asked (a fork) "
            "with Command(resume=...), or start a new thread for a new input"
        )
    return None


def make_planner_node(
    planner: Planner,
    tools: ToolResolver,
    *,
    agent_id: str | None = None,
    agents: Sequence[dict[str, Any]] = (),
) -> NodeFn:
    """``agents``: those this planner may hand off to. A sub-agent's node is handed the
    state as :func:`nodes.handoff.scoped` sees it: its task as input, its observations."""

    async def planner_node(state: RunState, runtime: Runtime[Context]) -> dict[str, Any]:
        taken = thread_taken(state)
        if taken:
            raise ValueError(taken)
        ctx = await services(runtime, state)
        usage = Usage.model_validate(state.get("usage") or {})
        limits = limits_from(state.get("limits"))
        step_index = usage.steps
        recorded = None
        if ctx.may_have_recorded(step_index):
            recorded = await ctx.store.get_step(ctx.run_id, step_index)
        if recorded is not None:
            decision = recorded.decision
        else:
            over = before_plan(usage, limits, ctx.active_s())
            if over:
                return {"outcome": failed(Code.RUN_BUDGET_EXCEEDED, over)}
            if "input" not in state:  # a graph invoked directly (Studio): the API checks
                raise ValueError("the graph's input has no 'input': the question or task")
            view = PlannerView(
                run_id=ctx.run_id,
                input=state["input"],
                context=run_context(state),
                step_index=step_index,
                observations=[Observation.model_validate(o) for o in state.get("observations", [])],
                tools=[spec.describe() for spec in tools.specs()],
                usage=usage,
                agent_id=agent_id or ctx.agent_id or "",
                task_data=state.get("task_data"),  # type: ignore[typeddict-item]
                agents=list(agents),
                llm_calls_left=limits.max_llm_calls - usage.llm_calls,
            )
            started = utcnow()
            answered: Decision | None = None
            try:
                decision = answered = await planner.next_step(view)
                decision = decision.model_copy(update={"usage": counted(decision.usage)})
                proposed = decision.model_dump()
                if nests_deeper(proposed):  # no store keeps it: the planner's error
                    raise ValueError(f"the decision nests deeper than {MAX_NESTING} levels")
                # What no store keeps (a model's broken token, NaN, 2**64) is made
                # keepable before the step is recorded, rather than failing the run once
                # it is: the guard checks the arguments as they were recorded, and one
                # that no longer fits its schema goes back to the planner.
                decision = Decision.model_validate(plain_json(proposed)[0])
            except Exception as exc:  # a planner bug or a model outage ends the run, visibly
                # (its error event is written with the run's end, as every failure's is).
                # A reply that came and was not kept was paid for all the same.
                # (A planner's answer that is no Decision is its bug: it says nothing.)
                paid_for = isinstance(answered, Decision) and isinstance(
                    answered.usage, DecisionUsage
                )
                paid = counted(answered.usage if paid_for else spent_of(exc))  # type: ignore[union-attr]
                spent = usage.model_copy(
                    update={
                        "llm_calls": usage.llm_calls + paid.llm_calls,
                        "tokens": usage.tokens + paid.tokens,
                        "cost_usd": round(usage.cost_usd + paid.cost_usd, 9),
                        "active_s": ctx.active_s(),
                    }
                )
                return {
                    "outcome": failed(Code.PLANNER_ERROR, repr(exc)),
                    "usage": spent.model_dump(),
                }
            if decision.kind == "tool_calls" and not decision.tool_calls:
                # What it spent, answered and summed up stays: only its kind changes.
                summary = decision.summary or "no tool calls proposed"
                decision = decision.model_copy(update={"kind": "finish", "summary": summary})
            # Whose decision it is is the runtime's to say, not the planner's.
            decision = decision.model_copy(update={"agent_id": agent_id or ctx.agent_id})
            step = Step(
                run_id=ctx.run_id,
                step_index=step_index,
                decision=decision,
                started_at=started,
                ended_at=utcnow(),
            )
            decision = (await ctx.store.record_step(step)).decision
        usage = usage.model_copy(
            update={
                "steps": step_index + 1,
                "llm_calls": usage.llm_calls + decision.usage.llm_calls,
                "tokens": usage.tokens + decision.usage.tokens,
                # To a billionth of a dollar: 0.1 + 0.05 is above 0.15 in binary floats.
                "cost_usd": round(usage.cost_usd + decision.usage.cost_usd, 9),
                "active_s": ctx.active_s(),
            }
        )
        update: dict[str, Any] = {
            "step_index": step_index,
            "decision": decision.model_dump(mode="json"),
            "usage": usage.model_dump(),
            "calls": [],
        }
        # Spent past a limit: the decision is on the record, but neither its calls nor
        # its answer are acted on.
        over = after_plan(usage, limits)
        calls = proposed_calls(ctx.run_id, step_index, decision)
        if over is not None:
            await not_run(ctx, step_index, calls, f"the budget ({over})", ended=True)
            return {**update, "outcome": failed(Code.RUN_BUDGET_EXCEEDED, over)}
        if calls and decision.kind != "tool_calls":
            # A finish or a handoff that also proposes calls: they are not run, and say so
            # (the planner sees why, should the finish be refused or the handoff return).
            verb = "finish" if decision.kind == "finish" else "hand off"
            told = await not_run(
                ctx, step_index, calls, "the step's decision", instead=f"was to {verb}"
            )
            update["observations"] = told
        return update

    return planner_node
