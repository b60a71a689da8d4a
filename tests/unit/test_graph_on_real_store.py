"""The approval stop and resume through the whole run graph, on the real store and checkpointer.

Kept on a real backend (SQLite and PostgreSQL) because it tests what the node
tests' FakeStore and InMemorySaver cannot: the engine's checkpointer saving and
restoring the interrupted graph, and the store's own SQL and transactions
serving every node of a run in turn. Each node's behaviour is tested alone, on
the fake, in ``test_node_*.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from graphs.run_graph import build_run_graph
from runtime import ids
from runtime.context import Context
from runtime.model import Decision, Usage
from runtime.planner import PlannerView
from runtime.policy import DefaultPolicy
from tests.agents import ScriptPlanner, call, finish
from tests.unit.conftest import MakeRun
from tests.unit.node_env import node_tools


def refund_then_finish(view: PlannerView) -> Decision:
    return finish("refunded") if view.observations else call("refund", amount=5)


@pytest.mark.parametrize("answer", ["approve", "reject"])
async def test_approval_interrupts_and_resumes(
    backend: Any, make_run: MakeRun, data_dir: Path, answer: str
) -> None:
    run = await make_run(backend.store)
    refunds: list[int] = []
    tools = node_tools(data_dir, refunds)
    graph = build_run_graph(ScriptPlanner(refund_then_finish), tools, DefaultPolicy()).compile(
        checkpointer=backend.checkpointer
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
    assert "high-risk" in intr.value["reason"] and refunds == []

    final = await drive(Command(resume={"decision": answer}))

    row = await backend.store.get_approval(approval_id)
    assert row.decided_by == "graph-resume"
    assert (await graph.aget_state(config)).next == ()
    if answer == "approve":
        assert row.status == "approved" and refunds == [5]
        assert final["outcome"]["status"] == "succeeded"
        assert final["result"]["answer"] == "refunded"
    else:
        assert row.status == "rejected" and refunds == []
        assert final["outcome"]["code"] == "APPROVAL_REJECTED"
