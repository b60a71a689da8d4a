"""What a node unit test hands a node: a hand-made state, fake services, the test tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langgraph.runtime import Runtime
from pydantic import BaseModel, Field

from nodes.guard import make_guard_node
from runtime import ids
from runtime.budget import Maxima, effective_limits
from runtime.context import Context
from runtime.model import Approval, Decision, RunOptions, Usage, utcnow
from runtime.policy import DefaultPolicy
from runtime.tooling import ToolBusinessError, ToolContext, ToolSpec
from tests.agents import build_tools
from tests.unit.fakes import FakeStore, node_runtime
from tools.registry import ToolRegistry


class RefundArgs(BaseModel):
    amount: int = Field(ge=1)


class SizeArgs(BaseModel):
    size: int = Field(ge=1)


def needs_vault(args: BaseModel) -> list[str]:
    return ["vault"]


def node_tools(data_dir: Path, refunds: list[int]) -> ToolRegistry:
    """``tests.agents``' tools, and some whose risk or outcome a node test needs.

    refund (high risk: the default policy asks a human), refund_soft (the same, but a
    rejection goes back to the planner), secret (needs a scope nobody has; secret_soft's
    denial goes back to the planner), report
    (an output too big to keep inline), lookup (a business error). ``refunds`` gets
    each amount a refund handler really paid out.
    """
    tools = build_tools(data_dir)

    async def refund(args: RefundArgs, ctx: ToolContext) -> dict[str, int]:
        refunds.append(args.amount)
        return {"refunded": args.amount}

    async def report(args: SizeArgs, ctx: ToolContext) -> dict[str, str]:
        return {"body": "x" * args.size}

    async def lookup(args: SizeArgs, ctx: ToolContext) -> dict[str, str]:
        raise ToolBusinessError(f"no customer {args.size}")

    tools.register(ToolSpec("refund", "1", "Refund.", RefundArgs, refund, risk="high"))
    tools.register(
        ToolSpec("refund_soft", "1", "Refund.", RefundArgs, refund, risk="high", on_reject="replan")
    )
    tools.register(
        ToolSpec(
            "secret_soft",
            "1",
            "Scoped; a denial goes back to the planner.",
            RefundArgs,
            refund,
            required_scopes=needs_vault,
            on_deny="replan",
        )
    )
    tools.register(
        ToolSpec("secret", "1", "Scoped.", RefundArgs, refund, required_scopes=needs_vault)
    )
    tools.register(ToolSpec("report", "1", "Big output.", SizeArgs, report))
    tools.register(ToolSpec("lookup", "1", "Business error.", SizeArgs, lookup))
    return tools


def limits(**options: Any) -> dict[str, Any]:
    """A run's effective limits for these ``RunOptions``, as state carries them."""
    return effective_limits(RunOptions.model_validate(options), Maxima()).model_dump()


class NodeEnv:
    """One run in a :class:`FakeStore`, the tools, and the runtime LangGraph hands a node."""

    def __init__(self, data_dir: Path, run_id: str = "run-node-test") -> None:
        self.run_id = run_id
        self.data_dir = data_dir
        self.store = FakeStore(run_id)
        self.refunds: list[int] = []
        self.tools = node_tools(data_dir, self.refunds)
        self.runtime: Runtime[Context] = node_runtime(self.store, run_id)

    def state(self, decision: Decision | None = None, **extra: Any) -> dict[str, Any]:
        """A graph state at step 0, as the planner leaves it; ``extra`` overrides keys."""
        return {
            "input": "help",
            "context": {"user_id": "u1", "tenant_id": "t1", "scope": []},
            "step_index": 0,
            "usage": Usage().model_dump(),
            "observations": [],
            **({"decision": decision.model_dump(mode="json")} if decision else {}),
            **extra,
        }

    async def guard(self, decision: Decision, **extra: Any) -> dict[str, Any]:
        """The guard's update for ``decision``: the simplest way to get well-formed calls."""
        node = make_guard_node(self.tools, DefaultPolicy())
        return await node(self.state(decision, **extra), self.runtime)  # type: ignore[no-any-return]

    def approval(self, c: dict[str, Any]) -> Approval:
        """The pending approval row the approval node would create for guarded call ``c``."""
        return Approval(
            approval_id=ids.call_approval_id(c),
            run_id=self.run_id,
            tool=c["tool"],
            version=c["version"],
            risk="high",
            status="pending",
            created_at=utcnow(),
            **{k: c[k] for k in ("tool_call_id", "args", "args_hash", "reason")},
        )

    async def approve(self, c: dict[str, Any], decision: str = "approved") -> None:
        """A human's decision on ``c``, given the way the API gives it: to the store."""
        await self.store.ensure_approval(self.approval(c), {})
        await self.store.decide_approval(
            ids.call_approval_id(c),
            "approved" if decision == "approved" else "rejected",
            decided_by="ann",
            comment=None,
        )

    async def event_types(self) -> list[str]:
        return [e.type for e in await self.store.list_events(self.run_id)]
