"""A chat-model planner hands off through its ``handoff_to_<agent>`` tool, on both databases.

The scripted model stands in for the LLM only; report_writer, the graph, the
store, the approval and the worker are the real ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from graphs.chat_planner import ModelOutputError, to_decision
from runtime.ids import handoff_id
from server.settings import Settings
from tests.api.test_chat_planner_api import last_tool_message, script, serve
from tests.unit.test_chat_planner import reply, tool_call
from tools.retail import count_outbox

QUESTION = "Which SKUs drove last week's sales drop in the east?"


def delegating_analyst(shown: Callable[[], list[BaseMessage]]) -> Iterator[AIMessage]:
    yield reply(tool_call("query_sales", "m1", region="east", top_n=3), tokens=10)
    findings = json.loads(str(last_tool_message(shown()).content))
    brief = {
        "title": "East region sales decline",
        "question": QUESTION,
        "findings": findings,
        "recipients": ["sales-ops@example.com"],
    }
    yield reply(
        tool_call("handoff_to_report_writer", "m2", task="Write and publish it", data=brief),
        tokens=10,
    )
    # report_writer's result comes back as the handoff tool's message.
    back = json.loads(str(last_tool_message(shown()).content))
    yield reply(content=f"Done: {back['data']['publish_status']}", tokens=10)


async def test_chat_planner_hands_off_and_reads_the_result(settings: Settings) -> None:
    model = script(delegating_analyst)
    async with serve(settings, model) as api:
        run = await api.create(input=QUESTION)
        run_id = run["run_id"]
        parked = await api.settle(run_id)
        assert parked["state"] == "waiting_human", parked
        # Parked in report_writer; the model has been asked twice, not while it worked.
        assert len(model.calls) == 2
        await api.decide(run_id, parked["pending_approval"]["approval_id"], "approve")
        final = await api.settle(run_id)
        assert final["state"] == "succeeded", final
        assert final["result"]["answer"] == "Done: succeeded"
        assert final["usage"]["llm_calls"] == 3  # report_writer's planner is no model
        steps = (await api.client.get(f"/runs/{run_id}/steps")).json()
        assert [(s["decision"]["agent_id"], s["decision"]["kind"]) for s in steps] == [
            ("retail_analyst", "tool_calls"),
            ("retail_analyst", "handoff"),
            ("report_writer", "tool_calls"),
            ("report_writer", "tool_calls"),
            ("report_writer", "finish"),
            ("retail_analyst", "finish"),
        ]
        # The third invocation saw the handoff as a call of step 1 answered by its result.
        third = model.calls[2]
        call = third[-2]
        assert isinstance(call, AIMessage) and isinstance(third[1], HumanMessage)
        assert [(c["name"], c["id"]) for c in call.tool_calls] == [
            ("handoff_to_report_writer", handoff_id(run_id, 1))
        ]
        assert last_tool_message(third).status == "success"
    assert count_outbox(settings.resolved_demo_db) == 1


def test_a_handoff_must_be_the_only_tool_call() -> None:
    agents = [{"agent_id": "report_writer", "description": "writes"}]
    both = reply(
        tool_call("query_sales", "a", region="east"),
        tool_call("handoff_to_report_writer", "b", task="t"),
    )
    with pytest.raises(ModelOutputError, match="only tool call"):
        to_decision(both, [], 0.0, agents)
    # Without the agent on offer, the same name is just an unknown tool for the guard.
    alone = to_decision(reply(tool_call("handoff_to_report_writer", "b", task="t")), [], 0.0)
    assert alone.kind == "tool_calls"
    handed = to_decision(
        reply(tool_call("handoff_to_report_writer", "b", task="t")), [], 0.0, agents
    )
    assert handed.kind == "handoff" and handed.handoff is not None
    assert (handed.handoff.agent_id, handed.handoff.task) == ("report_writer", "t")
