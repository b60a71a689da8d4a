"""What the audit surface shows of a run's calls: args declared secret are redacted.

Events and approvals are written redacted; steps and the ledger keep the real args
(the planner replays its steps, compensations need them), so they are redacted here,
on the way out. A call whose tool cannot be found (a planner's invented tool, an agent
no longer hosted) shows no values at all: what it declared secret is unknowable; nor
does a row that no longer validates (its unreadable form has no args).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.engine import Engine
from runtime.model import Run, Unreadable
from runtime.store.records import ShownStep, ShownToolCall
from runtime.tooling import REDACTED, ChainedTools, ToolSpec


class RunTools:
    """The tools a run's calls may have used: the deciding agent's, where a step names
    it, then the run's agent's, its hosted agents' included (``with_hosted_tools``).
    Never another agent's: a tool of the same name and version there may declare no
    secret and no second pair of eyes, where the run's own agent did."""

    def __init__(self, engine: Engine, run: Run) -> None:
        self.engine = engine
        self.run = run

    def resolve(
        self, tool: str, version: str | None, agent_id: str | None = None
    ) -> ToolSpec | None:
        order = [agent_id, self.run.agent_id]
        for name in dict.fromkeys(a for a in order if a):
            agent = self.engine.agents.get(name)
            if agent is None:
                continue
            if isinstance(agent.tools, ChainedTools) and agent.tools.ambiguous(tool, version):
                return None  # two of its agents define it: unknowable, shown as unknown
            spec = agent.tools.resolve(tool, version)
            if spec is not None:
                return spec
        return None

    def shown(
        self, tool: str, version: str | None, args: Mapping[str, Any], agent_id: str | None = None
    ) -> dict[str, Any]:
        spec = self.resolve(tool, version, agent_id)
        if spec is None:
            return {k: REDACTED for k in args}
        return spec.redact(args)


def redact_steps(tools: RunTools, steps: list[ShownStep]) -> list[ShownStep]:
    out: list[ShownStep] = []
    for step in steps:
        if isinstance(step, Unreadable):  # shows no args
            out.append(step)
            continue
        agent_id = step.decision.agent_id
        calls = [
            c.model_copy(update={"args": tools.shown(c.tool, c.version, c.args, agent_id)})
            for c in step.decision.tool_calls
        ]
        decision = step.decision.model_copy(update={"tool_calls": calls})
        out.append(step.model_copy(update={"decision": decision}))
    return out


def redact_tool_calls(tools: RunTools, calls: list[ShownToolCall]) -> list[ShownToolCall]:
    return [
        c
        if isinstance(c, Unreadable)
        else c.model_copy(update={"args": tools.shown(c.tool, c.version, c.args)})
        for c in calls
    ]
