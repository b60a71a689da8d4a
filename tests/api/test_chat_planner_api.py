"""The chat-model planner through the real graph, store and worker, on SQLite and PostgreSQL.

A scripted fake chat model stands in for the LLM: each of its replies may look at
the messages it was shown (e.g. to copy an artifact id), the way a model would.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from graphs.chat_planner import ChatModelPlanner
from graphs.retail_analyst import AGENT_ID, build_agent
from runtime.ids import tool_call_id
from server.settings import Settings
from tests.api.conftest import Api, open_api, states
from tests.unit.test_chat_planner import SECRET, ScriptedChatModel, reply, tool_call
from tools.retail import count_outbox

COST_PER_TOKEN = 1e-6


@asynccontextmanager
async def serve(settings: Settings, model: ScriptedChatModel) -> AsyncIterator[Api]:
    """The in-process app hosting retail_analyst with a chat-model planner."""
    agent = build_agent(
        settings.resolved_demo_db, ChatModelPlanner(model, cost_per_token=COST_PER_TOKEN)
    )
    async with open_api(settings, {AGENT_ID: agent}) as api:
        yield api


def script(
    replies: Callable[[Callable[[], list[BaseMessage]]], Iterator[AIMessage]],
) -> ScriptedChatModel:
    """A fake model whose replies are produced lazily, each seeing what the model was shown."""
    model: ScriptedChatModel | None = None

    def shown() -> list[BaseMessage]:
        assert model is not None
        return model.calls[-1]

    model = ScriptedChatModel(messages=replies(shown))
    return model


def last_tool_message(messages: list[BaseMessage]) -> ToolMessage:
    message = messages[-1]
    assert isinstance(message, ToolMessage), message
    return message


def analyst(shown: Callable[[], list[BaseMessage]]) -> Iterator[AIMessage]:
    # 1. A bad argument: the runtime's validation error comes back as a tool message.
    yield reply(tool_call("query_sales", "m1", region="east-china", top_n=3), tokens=100)
    # 2. Corrected. The text beside the call (chain of thought) is not kept.
    yield reply(
        tool_call("query_sales", "m2", region="east", top_n=3),
        content=f"The region must be one of the enum values. {SECRET}",
        tokens=100,
    )
    findings = json.loads(str(last_tool_message(shown()).content))
    yield reply(
        tool_call(
            "write_report",
            "m3",
            title="East region sales decline",
            question="Which SKUs drove last week's sales drop in the east region?",
            findings=findings,
        ),
        tokens=100,
    )
    report = json.loads(str(last_tool_message(shown()).content))
    yield reply(
        tool_call(
            "publish_report",
            "m4",
            artifact_id=report["artifact_id"],
            recipients=["sales-ops@example.com"],
            subject="East region sales decline",
        ),
        tokens=100,
    )
    assert last_tool_message(shown()).status == "success"
    top = findings["top_decliners"][0]
    yield reply(
        content=[
            {"type": "reasoning", "reasoning": f"{SECRET}: summarise the findings"},
            {"type": "text", "text": f"{top['sku']} ({top['name']}) drove the decline."},
        ],
        tokens=100,
    )


async def test_argument_error_fed_back_then_report_published_after_approval(
    settings: Settings,
) -> None:
    model = script(analyst)
    async with serve(settings, model) as api:
        run = await api.create(input="Which SKUs drove last week's sales drop in the east?")
        run_id = run["run_id"]
        parked = await api.settle(run_id)
        assert parked["state"] == "waiting_human", parked
        assert parked["pending_approval"]["tool"] == "publish_report"
        assert len(model.calls) == 4
        resp = await api.decide(run_id, parked["pending_approval"]["approval_id"], "approve")
        assert resp.status_code == 202, resp.text
        final = await api.settle(run_id)
        assert final["state"] == "succeeded", final
        assert count_outbox(api.settings.resolved_demo_db) == 1

        # The second invocation saw the validation error as the answer to its first call.
        assert len(model.calls) == 5
        second = model.calls[1]
        first_call = second[-2]
        assert isinstance(first_call, AIMessage)
        bad_id = tool_call_id(run_id, 0, 0)
        assert [(c["name"], c["id"]) for c in first_call.tool_calls] == [("query_sales", bad_id)]
        error = last_tool_message(second)
        assert error.tool_call_id == bad_id and error.status == "error"
        assert str(error.content).startswith("TOOL_ARGUMENT_INVALID: region:")
        # Each invocation sees the whole conversation so far, rebuilt from the observations.
        assert [len(c) for c in model.calls] == [2, 4, 6, 8, 10]
        # Its three tools, and the agent it may hand off to (this model does not).
        names = ["query_sales", "write_report", "publish_report", "handoff_to_report_writer"]
        assert model.bound and all(
            sorted(t["function"]["name"] for t in tools) == sorted(names) for tools in model.bound
        )

        top_sku = json.loads(str(model.calls[2][-1].content))["top_decliners"][0]["sku"]
        assert final["result"]["answer"].startswith(top_sku)
        assert final["result"]["artifacts"], final["result"]
        usage = final["usage"]
        assert (usage["llm_calls"], usage["tokens"], usage["steps"]) == (5, 500, 5)
        assert usage["cost_usd"] == pytest.approx(500 * COST_PER_TOKEN)
        assert states(await api.events(run_id)) == [
            "pending",
            "planning",
            "executing",  # guard rejects the bad argument
            "planning",
            "executing",  # query_sales
            "planning",
            "executing",  # write_report
            "planning",
            "executing",
            "waiting_human",
            "executing",  # publish_report, approved
            "planning",
            "executing",
            "succeeded",
        ]

        # The Step rows hold the structured decision and a short summary, nothing else.
        trace = (await api.client.get(f"/runs/{run_id}/trace")).json()
        decisions = [s["decision"] for s in trace["steps"]]
        assert [d["kind"] for d in decisions] == ["tool_calls"] * 4 + ["finish"]
        assert [d["summary"] for d in decisions[:4]] == [
            "call query_sales",
            "call query_sales",
            "call write_report",
            "call publish_report",
        ]
        assert [d["tool_calls"][0]["args"].get("region") for d in decisions[:2]] == [
            "east-china",
            "east",
        ]
        assert all(d["tool_calls"][0]["version"] == "1" for d in decisions[:4])
        assert decisions[4]["answer"] == final["result"]["answer"]
        assert len(decisions[4]["summary"]) <= 200
        assert all(
            d["usage"] == {"llm_calls": 1, "tokens": 100, "cost_usd": pytest.approx(1e-4)}
            for d in decisions
        )
        checkpoint = (await api.client.get(f"/runs/{run_id}/checkpoint")).text
        for text in (json.dumps(trace, ensure_ascii=False), checkpoint):
            assert SECRET not in text
            assert "enum values" not in text


def wanderer(shown: Callable[[], list[BaseMessage]]) -> Iterator[AIMessage]:
    yield reply(tool_call("teleport", "m1", where="mars"), tokens=10)
    error = last_tool_message(shown())
    yield reply(content=f"I cannot do that: {str(error.content).split(':', 1)[0]}", tokens=10)


async def test_an_unknown_tool_is_fed_back_and_the_model_finishes(settings: Settings) -> None:
    model = script(wanderer)
    async with serve(settings, model) as api:
        run = await api.create(input="teleport me")
        final = await api.settle(run["run_id"])
        assert final["state"] == "succeeded", final
        assert final["result"]["answer"] == "I cannot do that: TOOL_NOT_FOUND"
        error = last_tool_message(model.calls[1])
        assert error.content == "TOOL_NOT_FOUND: no tool teleport"
        assert error.tool_call_id == tool_call_id(run["run_id"], 0, 0)
        events = await api.events(run["run_id"])
        assert [e["data"]["code"] for e in events if e["type"] == "error"] == ["TOOL_NOT_FOUND"]
        tool_calls = (await api.client.get(f"/runs/{run['run_id']}/tool-calls")).json()
        assert tool_calls == []


def spender(shown: Callable[[], list[BaseMessage]]) -> Iterator[AIMessage]:
    yield reply(tool_call("query_sales", "m1", region="east"), tokens=80)
    yield reply(content="never asked", tokens=80)


async def test_the_token_budget_stops_a_chatty_model(settings: Settings) -> None:
    model = script(spender)
    async with serve(settings, model) as api:
        run = await api.create(input="east sales", options={"budget": {"max_tokens": 50}})
        final = await api.settle(run["run_id"])
        assert final["state"] == "failed", final
        assert final["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
        assert "max_tokens 50" in final["outcome"]["message"]
        assert len(model.calls) == 1
        assert (final["usage"]["llm_calls"], final["usage"]["tokens"]) == (1, 80)
        # The answer that spent past the budget is on the record, and not acted on.
        assert final["usage"]["tool_calls"] == 0 and final["outcome"]["side_effects"] == []
        [step] = (await api.client.get(f"/runs/{run['run_id']}/steps")).json()
        assert step["decision"]["tool_calls"][0]["tool"] == "query_sales"
        assert (await api.client.get(f"/runs/{run['run_id']}/tool-calls")).json() == []


async def test_a_model_error_fails_the_run_as_a_planner_error(settings: Settings) -> None:
    model = ScriptedChatModel(messages=iter(()), fail="provider unavailable")
    async with serve(settings, model) as api:
        run = await api.create(input="east sales")
        final = await api.settle(run["run_id"])
        assert final["state"] == "failed", final
        assert final["outcome"]["code"] == "PLANNER_ERROR"
        assert "provider unavailable" in final["outcome"]["message"]
        steps = (await api.client.get(f"/runs/{run['run_id']}/steps")).json()
        assert steps == []
        # The failed call is still a call the budget counts; one failure, one error event.
        assert final["usage"]["llm_calls"] == 1 == len(model.calls)
        errors = [e for e in await api.events(run["run_id"]) if e["type"] == "error"]
        assert [e["data"]["code"] for e in errors] == ["PLANNER_ERROR"]


@pytest.mark.parametrize("bad", [2**64, float("nan")])
async def test_an_argument_no_store_keeps_goes_back_to_the_model(
    settings: Settings, bad: float
) -> None:
    """Before, a model's 2**64 was recorded as the step and then failed the checkpoint
    (INTERNAL_ERROR). It is recorded as text (NaN as null), which the tool's schema
    refuses, and the model is told, as for any argument error (DESIGN §8)."""
    model = ScriptedChatModel(
        messages=iter([reply(tool_call("query_sales", top_n=bad)), reply(content="done")])
    )
    async with serve(settings, model) as api:
        run = await api.create(input="east sales")
        final = await api.settle(run["run_id"])
        assert final["state"] == "succeeded", final
        steps = (await api.client.get(f"/runs/{run['run_id']}/steps")).json()
        recorded = steps[0]["decision"]["tool_calls"][0]["args"]["top_n"]
        assert recorded == (None if bad != bad else str(bad))
        told = last_tool_message(model.calls[-1])
        assert "TOOL_ARGUMENT_INVALID" in str(told.content) and "top_n" in str(told.content)
        assert final["usage"]["llm_calls"] == 2
