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


async def test_a_new_input_on_a_thread_that_waits_or_has_ended_is_refused(
    backend: Any, make_run: MakeRun, data_dir: Path
) -> None:
    """A thread is one run. A LangGraph server (Studio) applies a new input to a thread
    and starts at the planner: on a parked run that orphaned its approval (the run went
    on, and a fork could still approve it: a second refund); on an ended one, the old
    answer stood under the new question."""
    run = await make_run(backend.store)
    refunds: list[int] = []
    graph = build_run_graph(
        ScriptPlanner(refund_then_finish), node_tools(data_dir, refunds), DefaultPolicy()
    ).compile(checkpointer=backend.checkpointer)
    config: Any = {"configurable": {"thread_id": run.run_id}}
    ctx = Context(run_id=run.run_id, store=backend.store)
    first: Any = {"input": "refund", "context": {"scope": []}, "usage": Usage().model_dump()}
    await graph.ainvoke(first, config, context=ctx, durability="sync")
    assert (await graph.aget_state(config)).next == ("approval",)

    asked = (await graph.aget_state(config)).config

    with pytest.raises(ValueError, match="waits for a human's decision"):
        await graph.ainvoke(first | {"input": "again"}, config, context=ctx, durability="sync")
    assert len(await backend.store.list_steps(run.run_id)) == 1
    assert len(await backend.store.list_approvals(run_id=run.run_id)) == 1
    # As the refusal says: the checkpoint that asked is resumed, and the run goes on.
    resumed: Any = Command(resume={"decision": "approve"})
    final = await graph.ainvoke(resumed, asked, context=ctx, durability="sync")
    assert final["outcome"]["status"] == "succeeded" and refunds == [5]

    ended = await make_run(backend.store)
    config = {"configurable": {"thread_id": ended.run_id}}
    ctx = Context(run_id=ended.run_id, store=backend.store)
    graph = build_run_graph(
        ScriptPlanner(lambda view: finish("done")), node_tools(data_dir, refunds), DefaultPolicy()
    ).compile(checkpointer=backend.checkpointer)
    done = await graph.ainvoke(first, config, context=ctx, durability="sync")
    assert done["outcome"]["status"] == "succeeded"
    with pytest.raises(ValueError, match=r"has ended \(succeeded\)"):
        await graph.ainvoke(first | {"input": "another"}, config, context=ctx, durability="sync")
    assert len(await backend.store.list_steps(ended.run_id)) == 1
    assert refunds == [5]
