"""An agent as the engine sees it: an id, a graph builder and the tools it may call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.tooling import ToolResolver


@dataclass(frozen=True)
class AgentSpec:
    agent_id: str
    description: str
    builder: Any
    """An uncompiled StateGraph over runtime.state.RunState with runtime.context.Context."""
    tools: ToolResolver
    metadata: dict[str, Any] = field(default_factory=dict)
