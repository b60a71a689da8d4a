"""Multi-agent handoff through the HTTP API, on SQLite and PostgreSQL.

A planner hands the run to a sub-agent; the sub-agent works with its own tools
(guard, policy, approval and ledger as usual) and its finish hands control back
with its result. The stack is in the checkpoint; the trace and events show both moves.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.agents import counter_lines
from tests.api.conftest import Api, states
from tools.retail import count_outbox


async def trace(api: Api, run_id: str) -> dict[str, Any]:
    resp = await api.client.get(f"/runs/{run_id}/trace")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


async def checkpoint(api: Api, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = (await api.client.get(f"/runs/{run_id}/checkpoint")).json()
    return body


def handoff_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A handoff's `action` (phase start) and `result` (phase return) events."""
    return [e for e in events if "handoff" in e["data"]]


def handoffs(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    moves = [e["data"]["handoff"] for e in handoff_events(events)]
    return [(h["phase"], h["from_agent"], h["to_agent"]) for h in moves]


async def test_sub_agent_result_returns_to_the_parent(api: Api) -> None:
    run = await api.create(agent_id="delegator", input="slow_worker sleep 0.01")
    final = await api.settle(run["run_id"])
    assert final["state"] == "succeeded", final
    assert final["result"]["answer"] == "slow_worker said slept"
    record = await trace(api, run["run_id"])
    steps = [
        (s["step_index"], s["decision"]["agent_id"], s["decision"]["kind"]) for s in record["steps"]
    ]
    assert steps == [
        (0, "delegator", "tool_calls"),  # echo
        (1, "delegator", "handoff"),
        (2, "slow_worker", "tool_calls"),  # counter
        (3, "slow_worker", "tool_calls"),  # sleep
        (4, "slow_worker", "finish"),  # hands control back
        (5, "delegator", "finish"),
    ]
    handoff = record["steps"][1]["decision"]["handoff"]
    assert handoff == {
        "agent_id": "slow_worker",
        "task": "sleep 0.01",
        "data": {"from": "delegator"},
    }
    calls = record["tool_calls"]
    assert [(c["step_index"], c["tool"]) for c in calls] == [
        (0, "echo"),
        (2, "counter"),
        (3, "sleep"),
    ]
    assert len({c["tool_call_id"] for c in calls}) == 3
    events = record["events"]
    assert handoffs(events) == [
        ("start", "delegator", "slow_worker"),
        ("return", "slow_worker", "delegator"),
    ]
    start, back = handoff_events(events)
    # To a consumer, a call of tool handoff_to_<agent> and its result.
    assert (start["type"], back["type"]) == ("action", "result")
    assert start["data"]["tool"] == back["data"]["tool"] == "handoff_to_slow_worker"
    assert start["data"]["tool_call_id"] == back["data"]["tool_call_id"]
    assert start["data"]["tool_call_id"].startswith("ho-")
    assert back["data"]["status"] == "succeeded" and back["data"]["output"] == "slept"
    # Both at the handoff's step, as a failure inside the sub-agent answers it.
    assert start["data"]["handoff"]["step_index"] == back["data"]["handoff"]["step_index"] == 1
    # The sub-agent's tool calls happen between the two, as seen on the stream.
    acted = [
        e["data"]["tool"]
        for e in events
        if e["type"] == "action" and start["seq"] < e["seq"] < back["seq"]
    ]
    assert acted == ["counter", "sleep"]
    cp = await checkpoint(api, run["run_id"])
    assert cp["handoff_stack"] == []
    assert cp["budget"]["steps"] == 6 and cp["budget"]["tool_calls"] == 3  # one budget for all
    assert final["usage"]["steps"] == 6
    assert len(counter_lines(api.settings.data_dir)) == 1


async def test_nested_handoffs_unwind_in_order(api: Api) -> None:
    run = await api.create(agent_id="delegator", input="relay slow_worker sleep 0.01")
    final = await api.settle(run["run_id"])
    assert final["state"] == "succeeded", final
    assert final["result"]["answer"] == "relay said slow_worker said slept"
    record = await trace(api, run["run_id"])
    assert handoffs(record["events"]) == [
        ("start", "delegator", "relay"),
        ("start", "relay", "slow_worker"),
        ("return", "slow_worker", "relay"),
        ("return", "relay", "delegator"),
    ]
    depths = [e["data"]["handoff"]["depth"] for e in handoff_events(record["events"])]
    assert depths == [1, 2, 2, 1]
    # Each delegator echoed its own first word: the relay saw its own task, not the run's input.
    echoes = [c["args"]["text"] for c in record["tool_calls"] if c["tool"] == "echo"]
    assert echoes == ["relay", "slow_worker"]
    assert [s["step_index"] for s in record["steps"]] == list(range(len(record["steps"])))


async def test_sub_agent_has_only_its_own_tools(api: Api) -> None:
    run = await api.create(agent_id="delegator", input="typo_fixer fix it")
    final = await api.settle(run["run_id"])
    assert final["state"] == "succeeded", final
    record = await trace(api, run["run_id"])
    # typo_fixer proposes echo, which the delegator has and it has not: refused, replanned.
    errors = [e["data"] for e in record["events"] if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["TOOL_NOT_FOUND"]
    assert [c["tool"] for c in record["tool_calls"]] == ["echo"]  # the delegator's own only
    assert final["result"]["answer"] == "typo_fixer said echo said None"


async def test_unknown_handoff_target_goes_back_to_the_planner(api: Api) -> None:
    run = await api.create(agent_id="delegator", input="nobody do it")
    final = await api.settle(run["run_id"])
    assert final["state"] == "succeeded", final
    assert final["result"]["answer"] == "handoff failed: AGENT_NOT_FOUND"
    events = await api.events(run["run_id"])
    assert handoffs(events) == []
    errors = [e["data"] for e in events if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["AGENT_NOT_FOUND"]
    assert "cannot hand off to nobody" in errors[0]["message"]


async def test_budget_is_shared_with_the_sub_agent(api: Api) -> None:
    steps = await api.create(
        agent_id="delegator", input="slow_worker sleep 0.01", options={"max_steps": 3}
    )
    calls = await api.create(
        agent_id="delegator",
        input="slow_worker sleep 0.01",
        options={"budget": {"max_tool_calls": 2}},
    )
    by_steps = await api.settle(steps["run_id"])
    assert by_steps["state"] == "failed", by_steps
    assert by_steps["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    assert "max_steps 3" in by_steps["outcome"]["message"]
    assert by_steps["usage"]["steps"] == 3
    # It ran out inside the sub-agent: the view says where it ended, nothing in progress.
    cp = await checkpoint(api, steps["run_id"])
    assert cp["handoff_stack"] == []
    assert [f["agent_id"] for f in cp["ended_inside"]] == ["slow_worker"]

    by_calls = await api.settle(calls["run_id"])
    assert by_calls["state"] == "failed" and by_calls["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    assert "max_tool_calls 2: 2 used" in by_calls["outcome"]["message"]
    ran = (await api.client.get(f"/runs/{calls['run_id']}/tool-calls")).json()
    assert [c["tool"] for c in ran] == ["echo", "counter"]


async def test_approval_inside_the_sub_agent_parks_and_resumes_the_run(api: Api) -> None:
    run = await api.create()
    parked = await api.settle(run["run_id"])
    assert parked["state"] == "waiting_human", parked
    assert parked["pending_approval"]["tool"] == "publish_report"
    cp = await checkpoint(api, run["run_id"])
    frame = cp["handoff_stack"][0]
    assert len(cp["handoff_stack"]) == 1
    assert (frame["agent_id"], frame["from_agent"], frame["depth"]) == (
        "report_writer",
        "retail_analyst",
        1,
    )
    assert frame["data"]["findings"]["region"] == "east"
    resp = await api.decide(run["run_id"], parked["pending_approval"]["approval_id"], "approve")
    assert resp.status_code == 202
    final = await api.settle(run["run_id"])
    assert final["state"] == "succeeded", final
    data = final["result"]["data"]
    # The analyst answers from what report_writer handed back.
    assert data["published"] is True and data["publish_status"] == "succeeded"
    assert data["report_artifact_id"] == final["result"]["artifacts"][0]
    assert isinstance(data["outbox_id"], int)
    assert (
        "queued for email" in final["result"]["answer"] or "提交发送" in final["result"]["answer"]
    )
    assert (await checkpoint(api, run["run_id"]))["handoff_stack"] == []
    assert count_outbox(api.settings.resolved_demo_db) == 1


async def test_rejection_inside_the_sub_agent_fails_the_run(api: Api) -> None:
    run = await api.create()
    parked = await api.settle(run["run_id"])
    await api.decide(run["run_id"], parked["pending_approval"]["approval_id"], "reject")
    final = await api.settle(run["run_id"])
    assert final["state"] == "failed" and final["outcome"]["code"] == "APPROVAL_REJECTED"
    events = await api.events(run["run_id"])
    # The failure answers the handoff still open: report_writer hands back nothing.
    assert handoffs(events) == [
        ("start", "retail_analyst", "report_writer"),
        ("return", "report_writer", "retail_analyst"),
    ]
    back = handoff_events(events)[-1]["data"]
    assert (back["status"], back["error"]["code"]) == ("failed", "APPROVAL_REJECTED")
    assert states(events)[-2:] == ["waiting_human", "failed"]
    assert count_outbox(api.settings.resolved_demo_db) == 0
    # The checkpoint view no longer shows the handoff in progress: it ended inside it.
    cp = await checkpoint(api, run["run_id"])
    assert cp["handoff_stack"] == [] and cp["next"] == []
    assert [f["agent_id"] for f in cp["ended_inside"]] == ["report_writer"]


async def test_report_writer_runs_on_its_own(api: Api) -> None:
    agents = {a["agent_id"]: a for a in (await api.client.get("/agents")).json()}
    assert {"retail_analyst", "report_writer"} <= set(agents)
    # Whom each may hand the run to: the analyst to the writer, the writer to nobody.
    assert agents["retail_analyst"]["handoffs"] == {
        "retail_analyst": ["report_writer"],
        "report_writer": [],
    }
    assert agents["report_writer"]["handoffs"] == {"report_writer": []}
    # An agent whose graph was built without an id is named as it is registered.
    assert agents["typo_fixer"]["handoffs"] == {"typo_fixer": []}
    parked = await api.settle((await api.create())["run_id"])
    findings = next(
        c["output"]
        for c in (await api.client.get(f"/runs/{parked['run_id']}/tool-calls")).json()
        if c["tool"] == "query_sales"
    )
    brief = {"title": "East", "question": "why?", "findings": findings, "publish": False}
    run = await api.create(agent_id="report_writer", input=json.dumps(brief))
    final = await api.settle(run["run_id"])
    assert final["state"] == "succeeded", final
    assert final["result"]["data"]["publish_status"] == "not_requested"
    assert final["result"]["artifacts"] == [final["result"]["data"]["report_artifact_id"]]
    assert handoffs(await api.events(run["run_id"])) == []


@pytest.mark.parametrize("size", [100, 100_000])
async def test_a_large_handed_back_result_is_kept_as_an_artifact(api: Api, size: int) -> None:
    """As a tool's output is: the caller's observation of it stays in every checkpoint
    after it (a probe saw 7 MB of checkpoints for one 200 KB result)."""
    run = await api.create(agent_id="delegator", input=f"bulky {size}")
    final = await api.settle(run["run_id"])
    assert final["state"] == "succeeded", final
    record = await trace(api, run["run_id"])
    _, back = handoff_events(record["events"])
    last = record["steps"][-1]["step_index"]
    context = (await api.client.get(f"/runs/{run['run_id']}/planner-context/{last}")).json()
    (seen,) = [o for o in context["observations"] if o["tool"] == "handoff_to_bulky"]
    if size < 4096:
        assert seen["output"] == {"answer": "bulk", "data": {"blob": "x" * size}, "artifacts": []}
        assert back["data"]["artifact_id"] is None
        return
    # The result's own artifact is the observation's to name: the event's artifact_id
    # stays what the sub-agent made (none here).
    assert back["data"]["artifact_id"] is None and seen["artifact_id"] is None
    output = seen["output"]
    assert output["size"] > size and output["artifacts"] == []
    # Its caller's planner still reads the answer, and the data where it is small.
    assert output["answer"] == "bulk" and output["data"] is None
    assert len(json.dumps(seen)) < 2048
    artifact_id = output["artifact_id"]
    whole = json.loads((await api.client.get(f"/artifacts/{artifact_id}")).content)
    assert whole == {"answer": "bulk", "data": {"blob": "x" * size}, "artifacts": []}


async def test_a_graph_built_without_an_id_hands_off_under_its_agent_s_name(api: Api) -> None:
    """The record said "" handed off (the graph's key for its own agent) where the steps,
    /agents and the planner context named the agent."""
    run = await api.create(agent_id="narrow_delegator", input="slow_worker sleep 0.01")
    final = await api.settle(run["run_id"])
    assert final["state"] == "succeeded", final
    record = await trace(api, run["run_id"])
    assert handoffs(record["events"]) == [
        ("start", "narrow_delegator", "slow_worker"),
        ("return", "slow_worker", "narrow_delegator"),
    ]
    deciders = [s["decision"]["agent_id"] for s in record["steps"]]
    assert deciders[0] == deciders[-1] == "narrow_delegator"


# narrow_delegator is registered with its own tool only, not its sub-agents': their
# side effects were left uncompensated without a word.
@pytest.mark.parametrize("agent", ["delegator", "narrow_delegator"])
async def test_cancel_inside_the_sub_agent_compensates_its_side_effects(
    api: Api, agent: str
) -> None:
    run = await api.create(agent_id=agent, input="slow_worker sleep 30")
    run_id = run["run_id"]
    await api.wait_event(run_id, lambda e: e["type"] == "action" and e["data"]["tool"] == "sleep")
    resp = await api.client.post(
        f"/runs/{run_id}/cancel", json={"reason": "stop", "compensate": True}
    )
    final = resp.json()
    assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_CANCELLED"
    calls = {c["tool"]: c for c in (await api.client.get(f"/runs/{run_id}/tool-calls")).json()}
    counter_id = calls["counter"]["tool_call_id"]  # the sub-agent's side effect
    assert final["outcome"]["side_effects"] == [counter_id]
    assert final["outcome"]["compensations"] == [counter_id]
    assert counter_lines(api.settings.data_dir) == [f"{counter_id} once", f"{counter_id} undo"]
    # The handoff is answered like the sleep it was running: no action left open.
    events = (await api.client.get(f"/runs/{run_id}/trace")).json()["events"]
    start, back = handoff_events(events)
    assert (start["type"], back["type"]) == ("action", "result")
    assert back["data"]["tool_call_id"] == start["data"]["tool_call_id"]
    assert (back["data"]["status"], back["data"]["error"]["code"]) == ("cancelled", "RUN_CANCELLED")
    # Cut off from outside the graph: the view says where, and the final budget.
    cp = await checkpoint(api, run_id)
    assert cp["handoff_stack"] == [] and cp["next"] == []
    assert [f["agent_id"] for f in cp["ended_inside"]] == ["slow_worker"]
    assert cp["budget"] == final["usage"]
    assert back["data"]["handoff"]["from_agent"] == "slow_worker"
    actions = {e["data"]["tool_call_id"] for e in events if e["type"] == "action"}
    results = {e["data"]["tool_call_id"] for e in events if e["type"] == "result"}
    assert actions == results
    assert events[-1]["data"]["to"] == "failed"  # answered before the terminal event
