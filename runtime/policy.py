"""Policy: asked before every tool call whether it may run, and whether a human must say so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel

from runtime.model import RunContext
from runtime.tooling import ToolSpec


@dataclass(frozen=True)
class Verdict:
    action: Literal["allow", "deny", "approve"]
    reason: str = ""


class Policy(Protocol):
    def decide(self, tool: ToolSpec, args: BaseModel, context: RunContext) -> Verdict: ...


class DefaultPolicy:
    """Scopes a tool requires must be in the run's context; high-risk tools need approval."""

    def __init__(self, approval_risks: frozenset[str] = frozenset({"high"})) -> None:
        self.approval_risks = approval_risks

    def decide(self, tool: ToolSpec, args: BaseModel, context: RunContext) -> Verdict:
        missing = [s for s in tool.required_scopes(args) if s not in context.scope]
        if missing:
            return Verdict("deny", f"{tool.name} needs scope {', '.join(missing)}")
        if tool.risk in self.approval_risks:
            return Verdict("approve", f"{tool.name} is {tool.risk}-risk and needs approval")
        return Verdict("allow")
