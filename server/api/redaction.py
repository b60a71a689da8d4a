"""What the audit surface shows of a run's calls: args declared secret are redacted.

Events and approvals are written redacted; steps and the ledger keep the real args
(the planner replays its steps, compensations need them), so they are redacted here,
on the way out.
"""

from __future__ import annotations

from runtime.agent import AgentSpec
from runtime.model import Step, ToolCall
from runtime.tooling import redact_args


def redact_steps(agent: AgentSpec | None, steps: list[Step]) -> list[Step]:
    tools = agent.tools if agent is not None else None
    out = []
    for step in steps:
        calls = [
            c.model_copy(update={"args": redact_args(tools, c.tool, c.version, c.args)})
            for c in step.decision.tool_calls
        ]
        decision = step.decision.model_copy(update={"tool_calls": calls})
        out.append(step.model_copy(update={"decision": decision}))
    return out


def redact_tool_calls(agent: AgentSpec | None, calls: list[ToolCall]) -> list[ToolCall]:
    tools = agent.tools if agent is not None else None
    return [
        c.model_copy(update={"args": redact_args(tools, c.tool, c.version, c.args)}) for c in calls
    ]
