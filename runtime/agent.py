"""An agent as the engine sees it: an id, a graph builder and the tools it may call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.ids import AGENT_ID
from runtime.planner import Planner
from runtime.policy import Policy
from runtime.tooling import ToolResolver


@dataclass(frozen=True)
class AgentSpec:
    agent_id: str
    """Letters, digits, ``_``, ``.`` and ``-``, at most 100, a letter or digit first."""
    description: str
    builder: Any
    """An uncompiled StateGraph over runtime.state.RunState with runtime.context.Context."""
    tools: ToolResolver
    """The agent's own tools. A cancel's compensation (and a cut-off call's reconcile)
    resolves the ledger's rows through them, and through the tools of the agents its
    graph hosts, which the server adds (``graphs.run_graph.with_hosted_tools``)."""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.agent_id, str) and AGENT_ID.fullmatch(self.agent_id)):
            raise ValueError(
                f"agent id {self.agent_id!r} is not letters, digits, '_', '.' and '-' "
                "(at most 100, a letter or digit first)"
            )


@dataclass(frozen=True)
class SubAgent:
    """An agent another agent's planner may hand the run to.

    The parent's graph hosts it: its planner decides with its own tools, which go
    through its policy, the approval node and the ledger like the parent's. The
    same parts usually also build it as a standalone :class:`AgentSpec`.
    """

    agent_id: str
    description: str
    planner: Planner
    tools: ToolResolver
    policy: Policy
    handoffs: tuple[SubAgent, ...] = ()
    """Agents this one may hand off to in turn."""

    def describe(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "description": self.description}
