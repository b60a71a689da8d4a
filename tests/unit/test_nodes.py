"""Each node alone, on a hand-made state and a real store; the approval node through a graph."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import BaseModel, Field

from graphs.run_graph import build_run_graph
from nodes.executor import make_executor_node
from nodes.finish import make_finish_node
from nodes.guard import make_guard_node
from nodes.planner import make_planner_node
from runtime import ids
from runtime.budget import Maxima, effective_limits
from runtime.context import Context
from runtime.model import Approval, Decision, RunOptions, Usage, utcnow
from runtime.planner import PlannerView
from runtime.policy import DefaultPolicy
from runtime.store.base import RunStore
from runtime.tooling import ToolContext, ToolSpec
from tests.agents import ScriptPlanner, build_tools, call, finish
from tests.unit.conftest import MakeRun
from tools.registry import ToolRegistry


class RefundArgs(BaseModel):
    amount: int = Field(ge=1)


def needs_vault(args: BaseModel) -> list[str]:
    return ["vault"]


class Env:
    """A run in a real store, the test tools, and a fake LangGraph runtime."""

    def __init__(self, store: RunStore, run_id: str, data_dir: Path) -> None:
        self.store = store
        self.run_id = run_id
        self.refunds: list[int] = []
        self.tools: ToolRegistry = build_tools(data_dir)

        async def refund(args: RefundArgs, ctx: ToolContext) -> dict[str, int]:
            self.refunds.append(args.amount)
            return {"refunded": args.amount}

        self.tools.register(ToolSpec("refund", "1", "Refund.", RefundArgs, refund, risk="high"))
        self.tools.register(
            ToolSpec("secret", "1", "Scoped.", RefundArgs, refund, required_scopes=needs_vault)
        )
        self.runtime = SimpleNamespace(context=Context(run_id=run_id, store=store))

    def state(self, decision: Decision | None = None, **extra: Any) -> dict[str, Any]:
        return {
            "input": "help",
            "context": {"user_id": "u1", "tenant_id": "t1", "scope": []},
            "step_index": 0,
            "usage": Usage().model_dump(),
            "observations": [],
            **({"decision": decision.model_dump(mode="json")} if decision else {}),
            **extra,
        }

    def approval(self, c: dict[str, Any]) -> Approval:
        """The pending approval row the approval node would create for guarded call ``c``."""
        return Approval(
            approval_id=ids.approval_id(c["tool_call_id"]),
            run_id=self.run_id,
            tool="refund@1",
            risk="high",
            status="pending",
            created_at=utcnow(),
            **{k: c[k] for k in ("tool_call_id", "args", "args_hash", "reason")},
        )

    async def guard(self, decision: Decision, **extra: Any) -> dict[str, Any]:
        node = make_guard_node(self.tools, DefaultPolicy())
        return await node(self.state(decision, **extra), self.runtime)  # type: ignore[no-any-return]


@pytest.fixture
async def env(sqlite_store: RunStore, make_run: MakeRun, data_dir: Path) -> Env:
    run = await make_run(sqlite_store)
    return Env(sqlite_store, run.run_id, data_dir)


def limits(**options: Any) -> dict[str, Any]:
    return effective_limits(RunOptions.model_validate(options), Maxima()).model_dump()


class CountingPlanner:
    def __init__(self, *decisions: Decision | Exception) -> None:
        self.decisions = list(decisions)
        self.views: list[PlannerView] = []

    async def next_step(self, view: PlannerView) -> Decision:
        self.views.append(view)
        out = self.decisions[len(self.views) - 1]
        if isinstance(out, Exception):
            raise out
        return out


# -- planner -----------------------------------------------------------------------


async def test_planner_records_a_step_and_returns_its_decision(env: Env) -> None:
    decision = call("echo", text="a", n=1)
    planner = CountingPlanner(decision)

    update = await make_planner_node(planner, env.tools)(env.state(), env.runtime)

    assert update["step_index"] == 0 and update["usage"]["steps"] == 1
    assert Decision.model_validate(update["decision"]) == decision
    step = await env.store.get_step(env.run_id, 0)
    assert step is not None and step.decision == decision
    assert {t["name"] for t in planner.views[0].tools} >= {"echo", "refund"}


async def test_planner_replays_the_recorded_decision(env: Env) -> None:
    planner = CountingPlanner(call("echo", text="a", n=1), finish("different"))
    node = make_planner_node(planner, env.tools)

    first = await node(env.state(), env.runtime)
    again = await node(env.state(), env.runtime)

    assert len(planner.views) == 1
    assert again["decision"] == first["decision"]


async def test_planner_stops_at_max_steps(env: Env) -> None:
    planner = CountingPlanner(finish("never"))
    state = env.state(usage=Usage(steps=2).model_dump(), limits=limits(max_steps=2))

    update = await make_planner_node(planner, env.tools)(state, env.runtime)

    assert update["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    assert planner.views == [] and await env.store.get_step(env.run_id, 2) is None


async def test_planner_exception_is_a_planner_error(env: Env) -> None:
    planner = CountingPlanner(ValueError("model down"))

    update = await make_planner_node(planner, env.tools)(env.state(), env.runtime)

    assert update["outcome"]["code"] == "PLANNER_ERROR"
    assert "model down" in update["outcome"]["message"]
    assert (await env.store.list_events(env.run_id))[-1].data["code"] == "PLANNER_ERROR"
    assert await env.store.get_step(env.run_id, 0) is None


# -- guard -------------------------------------------------------------------------


async def test_guard_passes_an_allowed_call(env: Env) -> None:
    update = await env.guard(call("echo", text="a", n=2))

    [c] = update["calls"]
    assert c["tool_call_id"] == ids.tool_call_id(env.run_id, 0, 0)
    assert (c["tool"], c["version"], c["args"]) == ("echo", "1", {"text": "a", "n": 2})
    assert c["args_hash"] == ids.content_hash(c["args"]) and c["needs_approval"] is False


async def test_guard_unknown_tool_is_an_observation(env: Env) -> None:
    update = await env.guard(call("teleport", where="mars"))

    assert update["calls"] == [] and "outcome" not in update
    [obs] = update["observations"]
    assert obs["status"] == "TOOL_NOT_FOUND" and "teleport" in obs["error"]


async def test_guard_bad_arguments_name_the_field(env: Env) -> None:
    update = await env.guard(call("echo", text="a", n="many"))

    assert update["calls"] == []
    [obs] = update["observations"]
    assert obs["status"] == "TOOL_ARGUMENT_INVALID" and obs["error"].startswith("n:")


async def test_guard_missing_scope_is_denied(env: Env) -> None:
    update = await env.guard(call("secret", amount=1))

    assert update["outcome"]["code"] == "POLICY_DENIED" and "vault" in update["outcome"]["message"]
    assert update["calls"] == []


async def test_guard_high_risk_needs_approval(env: Env) -> None:
    update = await env.guard(call("refund", amount=5))

    [c] = update["calls"]
    assert c["needs_approval"] is True and "high-risk" in c["reason"]
    assert c["tool_call_id"] == ids.tool_call_id(env.run_id, 0, 0)


async def test_guard_reserves_the_tool_budget(env: Env) -> None:
    decision = Decision(
        kind="tool_calls", tool_calls=[call("echo", text="a", n=1).tool_calls[0]] * 2
    )
    state = {
        "usage": Usage(tool_calls=1).model_dump(),
        "limits": limits(budget={"max_tool_calls": 2}),
    }

    update = await env.guard(decision, **state)

    assert update["outcome"]["code"] == "RUN_BUDGET_EXCEEDED" and update["calls"] == []


# -- executor ----------------------------------------------------------------------


async def test_executor_runs_the_guarded_calls(env: Env) -> None:
    guarded = await env.guard(call("echo", text="ab", n=2))
    state = env.state(usage=Usage(tool_calls=3).model_dump(), calls=guarded["calls"])

    update = await make_executor_node(env.tools)(state, env.runtime)

    tc_id = ids.tool_call_id(env.run_id, 0, 0)
    assert update["tool_calls"] == [tc_id] and update["calls"] == []
    [obs] = update["observations"]
    assert obs["status"] == "succeeded" and obs["output"] == {"text": "abab"}
    assert update["usage"]["tool_calls"] == 4 and "outcome" not in update
    row = await env.store.get_tool_call(tc_id)
    assert row is not None and row.status == "succeeded"


async def test_executor_refuses_an_unapproved_call(env: Env) -> None:
    guarded = await env.guard(call("refund", amount=5))
    state = env.state(calls=guarded["calls"])

    with pytest.raises(RuntimeError, match="no matching approval"):
        await make_executor_node(env.tools)(state, env.runtime)

    assert env.refunds == [] and await env.store.list_tool_calls(env.run_id) == []


async def test_executor_runs_an_approved_call(env: Env) -> None:
    [c] = (await env.guard(call("refund", amount=5)))["calls"]
    await env.store.ensure_approval(env.approval(c), {})
    await env.store.decide_approval(
        ids.approval_id(c["tool_call_id"]), "approved", decided_by="me", comment=None
    )

    update = await make_executor_node(env.tools)(env.state(calls=[c]), env.runtime)

    assert env.refunds == [5] and update["observations"][0]["status"] == "succeeded"


# -- finish ------------------------------------------------------------------------


async def test_finish_refuses_while_an_approval_is_pending(env: Env) -> None:
    [c] = (await env.guard(call("refund", amount=5)))["calls"]
    await env.store.ensure_approval(env.approval(c), {})

    update = await make_finish_node()(env.state(finish("done")), env.runtime)

    [obs] = update["observations"]
    assert obs["status"] == "FINISH_REFUSED" and "approval" in obs["error"]
    assert "result" not in update and "outcome" not in update


async def test_finish_succeeds_with_the_result(env: Env) -> None:
    observations = [{"artifact_id": "sha256:b"}, {"artifact_id": None}, {"artifact_id": "sha256:a"}]
    state = env.state(finish("42"), observations=observations)

    update = await make_finish_node()(state, env.runtime)

    assert update["outcome"] == {"status": "succeeded", "code": None, "message": ""}
    assert update["result"]["answer"] == "42"
    assert update["result"]["artifacts"] == ["sha256:a", "sha256:b"]


# -- approval, through a compiled graph -----------------------------------------------


def refund_then_finish(view: PlannerView) -> Decision:
    return finish("refunded") if view.observations else call("refund", amount=5)


@pytest.mark.parametrize("saver", ["memory", "backend"])
@pytest.mark.parametrize("answer", ["approve", "reject"])
async def test_approval_interrupts_and_resumes(
    backend: Any, make_run: MakeRun, data_dir: Path, saver: str, answer: str
) -> None:
    run = await make_run(backend.store)
    env = Env(backend.store, run.run_id, data_dir)
    checkpointer = InMemorySaver() if saver == "memory" else backend.checkpointer
    graph = build_run_graph(ScriptPlanner(refund_then_finish), env.tools, DefaultPolicy()).compile(
        checkpointer=checkpointer
    )
    config: Any = {"configurable": {"thread_id": run.run_id}}

    async def drive(graph_input: Any) -> dict[str, Any]:
        ctx = Context(run_id=run.run_id, store=backend.store)
        return await graph.ainvoke(graph_input, config, context=ctx, durability="sync")  # type: ignore[no-any-return]

    await drive({"input": "refund", "context": {"scope": []}, "usage": Usage().model_dump()})

    snapshot = await graph.aget_state(config)
    assert snapshot.next == ("approval",)
    [intr] = snapshot.interrupts
    approval_id = ids.approval_id(ids.tool_call_id(run.run_id, 0, 0))
    asked = {k: intr.value[k] for k in ("approval_id", "tool", "args", "risk")}
    assert asked == {
        "approval_id": approval_id,
        "tool": "refund",
        "args": {"amount": 5},
        "risk": "high",
    }
    assert "high-risk" in intr.value["reason"] and env.refunds == []

    final = await drive(Command(resume={"decision": answer}))

    row = await backend.store.get_approval(approval_id)
    assert row.decided_by == "graph-resume"
    assert (await graph.aget_state(config)).next == ()
    if answer == "approve":
        assert row.status == "approved" and env.refunds == [5]
        assert final["outcome"]["status"] == "succeeded"
        assert final["result"]["answer"] == "refunded"
    else:
        assert row.status == "rejected" and env.refunds == []
        assert final["outcome"]["code"] == "APPROVAL_REJECTED"
