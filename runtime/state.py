"""The graph state every agent graph carries: the run's decision context.

It is what LangGraph checkpoints (thread_id = run_id), so it holds only
JSON-shaped values, summaries and refs; bulk outputs live in artifacts.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Annotated, Any, Required

# typing_extensions' TypedDict: pydantic (and so LangGraph Studio's input form) cannot
# build a JSON schema from typing.TypedDict on Python < 3.12.
from typing_extensions import TypedDict

from runtime.model import RunContext


class InputState(TypedDict, total=False):
    input: Required[str]
    """The user's question or task, as given to POST /runs."""
    context: dict[str, Any]
    """user_id, tenant_id, scope…: passed unchanged into policy and tools."""
    limits: dict[str, Any]
    """The run's effective budget (runtime.model.Limits); defaults apply when absent."""


class RunState(InputState, total=False):
    step_index: int
    """Index of the step whose decision is being carried out."""
    usage: dict[str, Any]
    """Budget used so far (runtime.model.Usage); checked before every call."""
    decision: dict[str, Any] | None
    """The current step's structured decision (runtime.model.Decision)."""
    calls: list[dict[str, Any]]
    """The current step's tool calls after the guard: ids, args, args hash, verdict."""
    observations: Annotated[list[dict[str, Any]], operator.add]
    """What the planner has seen (runtime.planner.Observation): summaries and refs."""
    tool_calls: Annotated[list[str], operator.add]
    """tool_call_ids executed so far, in order; the ledger has their rows."""
    memory_version: int
    """Working-memory version; every write to observations bumps it."""
    handoff_stack: list[dict[str, Any]]
    """One frame per handoff in progress, innermost last; the last frame's agent is in control.

    A frame: handoff_id, agent_id (the sub-agent), from_agent, task, data, step_index
    (of the handoff decision), depth. Observations made while a frame is on top carry
    its handoff_id as ``frame``; the run's own agent's carry none.
    """
    outcome: dict[str, Any] | None
    """Set once the graph decides the run ends (runtime.model.Outcome, without side effects)."""
    result: dict[str, Any] | None
    """The answer of a succeeded run."""


def run_context(state: Mapping[str, Any]) -> RunContext:
    """Who the run is for, from the state's ``context`` (the defaults where it has none)."""
    return RunContext.model_validate(state.get("context") or {})


def failed(code: str, message: str, *, tool_call_id: str | None = None) -> dict[str, Any]:
    """The ``outcome`` a node returns when the run cannot go on; ``tool_call_id``: the
    call that stopped it. The run's one ``error`` event is written with its end."""
    # str(): a Code is a StrEnum, which the checkpoint's msgpack would keep as an enum
    # that LangGraph reads back only as an unregistered type (refused when strict).
    outcome = {"status": "failed", "code": str(code), "message": message}
    if tool_call_id is not None:
        outcome["tool_call_id"] = tool_call_id
    return outcome
