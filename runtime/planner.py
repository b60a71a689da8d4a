"""The planner interface: structured view in, structured decision out.

Deterministic planners and LLM planners implement the same protocol. The
planner only proposes; the runtime validates, authorises and executes.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from runtime.model import Decision, DecisionUsage, RunContext, Usage


class Observation(BaseModel):
    """What the planner learns from one tool call: a summary and a ref, not the bulk."""

    step_index: int
    tool_call_id: str
    tool: str
    status: str
    """succeeded, or the error code (TOOL_ARGUMENT_INVALID, TOOL_BUSINESS_ERROR, …)."""
    summary: str = ""
    output: Any = None
    artifact_id: str | None = None
    error: str | None = None


class PlannerView(BaseModel):
    """What a planner sees. After a handoff, the sub-agent's planner sees its task as
    ``input``, the handoff's data as ``task_data`` and only its own observations."""

    run_id: str
    input: str
    context: RunContext
    step_index: int
    observations: list[Observation] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    agent_id: str = ""
    """The agent planning: the run's own, or a sub-agent it handed off to."""
    task_data: dict[str, Any] | None = None
    agents: list[dict[str, Any]] = Field(default_factory=list)
    """Agents this planner may hand off to (agent_id, description)."""
    llm_calls_left: int | None = None
    """Model calls the run's budget still allows (at least 1 when a planner is asked):
    a planner that retries must not make more. None: no limit known."""


LLM_CALLS = "llm_calls"
"""The attribute on a planner's exception that says how many model calls the failed
step made (each counts against the run's budget); 0 where it does not say."""


LLM_SPENT = "llm_spent"
"""The attribute on a planner's exception with the :class:`DecisionUsage` of a reply the
model was paid for and that was not kept (tokens and cost; its calls are ``LLM_CALLS``)."""


def llm_calls_of(exc: BaseException) -> int:
    calls = getattr(exc, LLM_CALLS, 0)
    return calls if isinstance(calls, int) and calls > 0 else 0


def spent_of(exc: BaseException) -> DecisionUsage:
    """What a failed step's model calls cost: their count, and the tokens and cost of a
    reply that came and was not kept."""
    spent = getattr(exc, LLM_SPENT, None)
    reply = spent if isinstance(spent, DecisionUsage) else DecisionUsage()
    return reply.model_copy(update={"llm_calls": llm_calls_of(exc)})


class Planner(Protocol):
    async def next_step(self, view: PlannerView) -> Decision: ...
