"""Handoff between agents inside one run graph: the stack's top frame says who is in control.

A planner's ``handoff`` decision pushes a frame onto ``handoff_stack``; from then
on the graph's planner, guard, approval and executor nodes act for the frame's
agent (its planner, its tools, its policy), and the observations they make are
tagged with the frame, so each planner sees only its own. The sub-agent's
``finish`` pops the frame and hands its result to the caller as an observation.

Everything lives in the one checkpointed graph state: a crash or an approval wait
inside a sub-agent resumes exactly like one in the run's own agent, with the
same thread, the same interrupt and the same ledger ids (the step index keeps
counting across agents).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph.runtime import Runtime

from nodes.finish import artifacts_of, record_refusal, refusal, terminal_problems
from runtime import ids
from runtime.context import Context, services
from runtime.errors import Code, Recovery
from runtime.events import EventType, handoff_tool, summarize
from runtime.ledger import StoreArtifacts, kept
from runtime.model import Decision
from runtime.state import RunState
from runtime.storable import nests_deeper, plain_json

NodeFn = Any
ROOT = ""
"""Key of the run's own agent among a graph's agents when its id is not known."""
MAX_DEPTH = 8
"""Handoffs in progress at once; bounds agents that hand off to each other in a loop."""


def top(state: RunState) -> dict[str, Any] | None:
    stack = state.get("handoff_stack") or []
    return stack[-1] if stack else None


def frame_id(frame: Mapping[str, Any] | None) -> str | None:
    return None if frame is None else str(frame["handoff_id"])


def scoped(state: RunState) -> RunState:
    """The state as the agent in control sees it: its task and its own observations."""
    frame = top(state)
    fid = frame_id(frame)
    view: dict[str, Any] = {
        **state,
        "observations": [o for o in state.get("observations", []) if o.get("frame") == fid],
    }
    if frame is not None:
        view["input"] = frame["task"]
        view["task_data"] = frame.get("data")
    return view  # type: ignore[return-value]


def tagged(update: dict[str, Any], frame: Mapping[str, Any] | None) -> dict[str, Any]:
    fid = frame_id(frame)
    if fid is not None and update.get("observations"):
        update = {**update, "observations": [{**o, "frame": fid} for o in update["observations"]]}
    return update


def dispatch(nodes: Mapping[str, NodeFn], root: str) -> NodeFn:
    """One graph node that runs the given agent's version of it for the agent in control."""

    async def node(state: RunState, runtime: Runtime[Context]) -> dict[str, Any]:
        frame = top(state)
        agent = root if frame is None else str(frame["agent_id"])
        update: dict[str, Any] = await nodes[agent](scoped(state), runtime)
        return tagged(update, frame)

    return node


def _refused(step: int, hid: str, target: str, code: Code, message: str) -> dict[str, Any]:
    return {
        "step_index": step,
        "tool_call_id": hid,
        "tool": handoff_tool(target),
        "status": code.value,
        "error": message,
        "summary": message,
    }


def make_handoff_node(targets: Mapping[str, set[str]], root: str) -> NodeFn:
    """``targets``: for each agent the graph hosts, the agents it may hand off to."""

    async def handoff_node(state: RunState, runtime: Runtime[Context]) -> dict[str, Any]:
        ctx = await services(runtime, state)
        decision = Decision.model_validate(state["decision"])
        assert decision.handoff is not None, "the planner routes only handoffs here"
        step = state["step_index"]
        stack = list(state.get("handoff_stack") or [])
        frame = top(state)
        current = root if frame is None else str(frame["agent_id"])
        # On the record by its name: a graph built without one (ROOT) is its run's agent.
        named = current or ctx.agent_id or ROOT
        target = decision.handoff.agent_id
        hid = ids.handoff_id(ctx.run_id, step)
        problem: tuple[Code, str] | None = None
        if target not in targets.get(current, set()):
            problem = Code.AGENT_NOT_FOUND, f"{named or 'this agent'} cannot hand off to {target}"
        elif len(stack) >= MAX_DEPTH:
            problem = Code.HANDOFF_TOO_DEEP, f"handoff depth {MAX_DEPTH} reached"
        if problem is not None:
            code, message = problem
            # Like an unknown tool: the planner is told and may pick another path.
            await ctx.store.append_event(
                ctx.run_id,
                EventType.ERROR,
                {
                    "code": code,
                    "message": message,
                    "handoff_id": hid,
                    "recovery": Recovery.REPLAN,  # sent back to the planner, as a bad call is
                },
                dedupe_key=f"error:{hid}",
            )
            return tagged(
                {
                    "observations": [_refused(step, hid, target, code, message)],
                    "memory_version": state.get("memory_version", 0) + 1,
                },
                frame,
            )
        pushed = {
            "handoff_id": hid,
            "agent_id": target,
            "from_agent": named,
            "task": decision.handoff.task,
            "data": decision.handoff.data,
            "step_index": step,
            "depth": len(stack) + 1,
        }
        # To an API consumer a handoff is a call like a tool's (DESIGN §4 has no other
        # event type): an `action` now, its `result` when the sub-agent hands back.
        await ctx.store.append_event(
            ctx.run_id,
            EventType.ACTION,
            {
                "tool_call_id": hid,
                "tool": handoff_tool(target),
                "version": None,
                "args": summarize({"task": decision.handoff.task, "data": decision.handoff.data}),
                "handoff": {
                    "phase": "start",
                    "from_agent": named,
                    "to_agent": target,
                    "step_index": step,
                    "depth": len(stack) + 1,
                    "task": summarize(decision.handoff.task),
                },
            },
            dedupe_key=ids.handoff_key(hid, "start"),
        )
        return {
            "handoff_stack": [*stack, pushed],
            "memory_version": state.get("memory_version", 0) + 1,
        }

    return handoff_node


HANDBACK_ANSWER_CHARS = 4000
"""Of a result kept in an artifact, the answer's first characters the caller still sees."""
HANDBACK_DATA_BYTES = 2048
"""Of a result kept in an artifact, the largest data (as JSON) the caller still sees."""


def readable(answer: str | None, data: dict[str, Any] | None) -> dict[str, Any]:
    """What a caller's planner still reads of a result kept in an artifact: the answer,
    clipped, and the structured data where it is small (a planner reads fields of it)."""
    shown: dict[str, Any] = {"answer": None if answer is None else answer[:HANDBACK_ANSWER_CHARS]}
    try:
        value, encoded = plain_json(data)
    except (RecursionError, ValueError, TypeError):
        value, encoded = None, b""
    fits = len(encoded) <= HANDBACK_DATA_BYTES and not nests_deeper(value)
    shown["data"] = value if fits else None
    return shown


def make_handback_node() -> NodeFn:
    """A sub-agent's ``finish``: the terminal check of its work, then control goes back."""

    async def handback_node(state: RunState, runtime: Runtime[Context]) -> dict[str, Any]:
        ctx = await services(runtime, state)
        stack = list(state.get("handoff_stack") or [])
        assert stack, "the planner routes only a sub-agent's finish here"
        frame = stack[-1]
        decision = Decision.model_validate(state["decision"])
        problems = await terminal_problems(state, ctx)
        if problems:
            await record_refusal(ctx, state["step_index"], problems)
            return tagged(
                {
                    "observations": [refusal(state, problems)],
                    "memory_version": state.get("memory_version", 0) + 1,
                },
                frame,
            )
        mine = [o for o in state.get("observations", []) if o.get("frame") == frame["handoff_id"]]
        artifacts = artifacts_of(mine)
        result: dict[str, Any] = {
            "answer": decision.answer,
            "data": decision.data,
            "artifacts": artifacts,
        }
        # Large, it is kept whole in an artifact, as a tool's output is: the caller's
        # observation of it stays in every later checkpoint.
        name = f"{handoff_tool(str(frame['agent_id']))}-result.json"
        result, whole = await kept(result, name, StoreArtifacts(ctx.store, ctx.run_id))
        if whole is not None:
            result.update(readable(decision.answer, decision.data), artifacts=artifacts)
        caller = stack[-2] if len(stack) > 1 else None
        back = {
            # The result answers the caller's handoff step, as a tool's result answers its call.
            "step_index": frame["step_index"],
            "tool_call_id": frame["handoff_id"],
            "tool": handoff_tool(str(frame["agent_id"])),
            "status": "succeeded",
            "summary": summarize(decision.answer or decision.summary),
            "output": result,
            "artifact_id": artifacts[0] if len(artifacts) == 1 else None,
            "error": None,
        }
        await ctx.store.append_event(
            ctx.run_id,
            EventType.RESULT,
            {
                **{k: back[k] for k in ("tool_call_id", "tool", "status", "artifact_id", "error")},
                "output": back["summary"],
                "handoff": {
                    "phase": "return",
                    "from_agent": frame["agent_id"],
                    "to_agent": frame["from_agent"],
                    # The handoff's step, as its start, its observation and a failure's
                    # answer say: a consumer pairs them, and reads the finish in the steps.
                    "step_index": frame["step_index"],
                    "depth": frame["depth"],
                    "artifacts": artifacts,
                },
            },
            dedupe_key=ids.handoff_key(frame["handoff_id"], "return"),
        )
        return tagged(
            {
                "handoff_stack": stack[:-1],
                "observations": [back],
                "memory_version": state.get("memory_version", 0) + 1,
            },
            caller,
        )

    return handback_node
