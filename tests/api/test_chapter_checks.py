"""The seven checks of chapter 22.6, through the HTTP API, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

from runtime import ids
from tests.agents import counter_lines
from tests.api.conftest import Api, states
from tools.retail import count_outbox, outbox_rows

QUESTION = "上周华东区销售下滑的主要 SKU 是什么？"


async def park(api: Api, **body: Any) -> dict[str, Any]:
    run = await api.create(**body)
    parked = await api.settle(str(run["run_id"]))
    assert parked["state"] == "waiting_human", parked
    return parked


async def test_1_normal_run_reaches_succeeded_and_the_stream_shows_it(api: Api) -> None:
    parked = await park(api)
    run_id = parked["run_id"]
    # It knows why it waits, where it goes on, and for whom: an approver of the tenant,
    # not the user who started it (publishing wants four eyes).
    waits = parked["pending_approval"]
    assert waits["tool"] == "publish_report" and waits["reason"]
    assert waits["awaiting"] == {
        "tenant_id": "demo-retail",
        "role": "approver",
        "not_user": "u-ops-001",
    }
    [asked] = [e for e in await api.events(run_id) if e["type"] == "approval_request"]
    assert asked["data"]["awaiting"] == waits["awaiting"]
    resp = await api.decide(run_id, parked["pending_approval"]["approval_id"], "approve")
    assert resp.status_code == 202
    final = await api.settle(run_id)
    assert final["state"] == "succeeded", final
    assert final["outcome"]["status"] == "succeeded"
    events = await api.events(run_id)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert states(events) == [
        "pending",
        "planning",
        "executing",  # query_sales
        "planning",
        "executing",  # handoff to report_writer
        "planning",
        "executing",  # write_report (report_writer)
        "planning",
        "executing",
        "waiting_human",
        "executing",  # publish_report (report_writer), approved
        "planning",
        "executing",  # report_writer finishes: control goes back
        "planning",
        "executing",
        "succeeded",  # finish and the terminal check
    ]
    types = [e["type"] for e in events]
    for kind in ("action", "result", "artifact", "approval_request", "approval_result"):
        assert kind in types
    # DESIGN §4: exactly seven types, whatever nodes the graph has (a handoff too).
    assert set(types) <= {
        "state",
        "action",
        "result",
        "approval_request",
        "approval_result",
        "artifact",
        "error",
    }
    handoffs = [(e["type"], e["data"]["handoff"]) for e in events if "handoff" in e["data"]]
    assert [(t, h["phase"], h["from_agent"], h["to_agent"]) for t, h in handoffs] == [
        ("action", "start", "retail_analyst", "report_writer"),
        ("result", "return", "report_writer", "retail_analyst"),
    ]
    answer = final["result"]["answer"]
    top = final["result"]["data"]["top_skus"]
    assert top and all(sku in answer for sku in top)
    report_id = final["result"]["artifacts"][0]
    report = await api.client.get(f"/artifacts/{report_id}")
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/markdown")
    assert top[0] in report.text
    assert count_outbox(api.settings.resolved_demo_db) == 1


async def test_1_english_question_other_region_needs_its_scope(api: Api) -> None:
    run = await api.create(
        input="Which SKUs drove last week's sales drop in the north region?",
        context={"scope": ["sales_region:east"]},
    )
    final = await api.settle(run["run_id"])
    assert final["state"] == "failed"
    assert final["outcome"]["code"] == "POLICY_DENIED"
    assert final["outcome"]["side_effects"] == []
    events = await api.events(run["run_id"])
    # One error event for one failure, naming the call the policy stopped.
    [error] = [e for e in events if e["type"] == "error"]
    assert error == events[-2] and error["data"]["code"] == "POLICY_DENIED"
    *_, last = (await api.client.get(f"/runs/{run['run_id']}/steps")).json()
    proposed = range(len(last["decision"]["tool_calls"]))
    denied = {ids.tool_call_id(run["run_id"], last["step_index"], i) for i in proposed}
    assert error["data"]["tool_call_id"] in denied


async def test_2_argument_error_is_fed_back_and_corrected(api: Api) -> None:
    run = await api.create(agent_id="typo_fixer", input="echo twice")
    final = await api.settle(run["run_id"])
    assert final["state"] == "succeeded", final
    assert final["result"]["answer"] == "echo said {'text': 'hihi'}"
    errors = [e for e in await api.events(run["run_id"]) if e["type"] == "error"]
    assert [e["data"]["code"] for e in errors] == ["TOOL_ARGUMENT_INVALID"]
    assert "n:" in errors[0]["data"]["message"]
    steps = (await api.client.get(f"/runs/{run['run_id']}/steps")).json()
    assert [s["decision"]["kind"] for s in steps] == ["tool_calls", "tool_calls", "finish"]


async def test_2_a_planner_that_never_corrects_ends_within_its_budget(api: Api) -> None:
    run = await api.create(agent_id="stubborn", input="loop", options={"max_steps": 4})
    final = await api.settle(run["run_id"])
    assert final["state"] == "failed"
    assert final["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    assert "max_steps 4" in final["outcome"]["message"]
    assert final["usage"]["steps"] == 4
    tool_calls = (await api.client.get(f"/runs/{run['run_id']}/tool-calls")).json()
    assert tool_calls == []  # nothing with bad arguments ever ran


async def test_4_approve_resumes_the_same_run_reject_fails_it(api: Api) -> None:
    approved = await park(api)
    rejected = await park(api)
    await api.decide(approved["run_id"], approved["pending_approval"]["approval_id"], "approve")
    resp = await api.decide(
        rejected["run_id"], rejected["pending_approval"]["approval_id"], "reject"
    )
    assert resp.status_code == 202 and resp.json()["status"] == "rejected"
    ok, no = await api.settle(approved["run_id"]), await api.settle(rejected["run_id"])
    assert ok["run_id"] == approved["run_id"] and ok["state"] == "succeeded"
    assert no["state"] == "failed" and no["outcome"]["code"] == "APPROVAL_REJECTED"
    assert no["pending_approval"] is None
    assert states(await api.events(no["run_id"]))[-2:] == ["waiting_human", "failed"]
    assert count_outbox(api.settings.resolved_demo_db) == 1


async def test_5_duplicate_and_concurrent_approval_callbacks_have_one_effect(api: Api) -> None:
    parked = await park(api)
    run_id, approval_id = parked["run_id"], parked["pending_approval"]["approval_id"]
    responses = await asyncio.gather(
        *(api.decide(run_id, approval_id, "approve") for _ in range(10))
    )
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 9 + [202]
    final = await api.settle(run_id)
    assert final["state"] == "succeeded"
    again = await api.decide(run_id, approval_id, "approve")
    assert again.status_code == 200
    conflict = await api.decide(run_id, approval_id, "reject")
    assert conflict.status_code == 409 and conflict.json()["code"] == "APPROVAL_CONFLICT"
    rows = outbox_rows(api.settings.resolved_demo_db)
    assert len(rows) == 1
    calls = (await api.client.get(f"/runs/{run_id}/tool-calls")).json()
    publish = next(t for t in calls if t["tool"] == "publish_report")
    assert rows[0]["idempotency_key"] == publish["idempotency_key"]
    assert publish["attempts"] == 1


async def test_7_budget_cancellation_and_unrecoverable_errors_end_failed(api: Api) -> None:
    tool_budget = await api.create(
        agent_id="typo_fixer", input="x", options={"budget": {"max_tool_calls": 0}}
    )
    broken = await api.create(agent_id="broken", input="x")
    parked = await park(api)
    cancelled = await api.client.post(
        f"/runs/{parked['run_id']}/cancel", json={"reason": "user closed the task"}
    )
    assert cancelled.status_code == 200, cancelled.text

    over = await api.settle(tool_budget["run_id"])
    assert over["state"] == "failed" and over["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    assert "max_tool_calls 0" in over["outcome"]["message"]

    failed = await api.settle(broken["run_id"])
    assert failed["state"] == "failed" and failed["outcome"]["code"] == "TOOL_UNAVAILABLE"
    flaky_calls = (api.settings.data_dir / "flaky.log").read_text().splitlines()
    assert len(flaky_calls) == 3  # bounded retries, then stop

    gone = cancelled.json()
    assert gone["state"] == "failed" and gone["outcome"]["code"] == "RUN_CANCELLED"
    assert gone["outcome"]["message"] == "user closed the task (requested by u-ops-001)"
    assert gone["pending_approval"] is None
    # What it made before the cancel (the report it asked to publish) is kept, and named.
    made = [
        e["data"]["artifact_id"]
        for e in await api.events(parked["run_id"])
        if e["type"] == "artifact"
    ]
    assert made and gone["outcome"]["artifacts"] == made
    assert over["outcome"]["artifacts"] == []
    approval = (
        await api.client.get("/approvals", params={"state": "expired", "run_id": parked["run_id"]})
    ).json()
    assert len(approval) == 1
    late = await api.decide(parked["run_id"], parked["pending_approval"]["approval_id"], "approve")
    assert late.status_code == 409
    assert count_outbox(api.settings.resolved_demo_db) == 0


async def test_7_cancel_while_a_tool_runs_records_side_effects_and_compensates(api: Api) -> None:
    run = await api.create(agent_id="slow_worker", input="sleep 30")
    run_id = run["run_id"]
    await api.wait_event(run_id, lambda e: e["type"] == "action" and e["data"]["tool"] == "sleep")
    resp = await api.client.post(f"/runs/{run_id}/cancel", json={"reason": "stop"})
    final = resp.json()
    assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_CANCELLED"
    calls = {c["tool"]: c for c in (await api.client.get(f"/runs/{run_id}/tool-calls")).json()}
    assert calls["counter"]["status"] == "succeeded"
    assert calls["sleep"]["status"] == "cancelled"
    assert final["outcome"]["side_effects"] == [calls["counter"]["tool_call_id"]]
    assert len(counter_lines(api.settings.data_dir)) == 1
    again = await api.client.post(f"/runs/{run_id}/cancel", json={})
    assert again.status_code == 200


async def test_7_active_time_budget_stops_a_hanging_tool(api: Api) -> None:
    run = await api.create(
        agent_id="slow_worker", input="sleep 30", options={"budget": {"timeout_s": 0.5}}
    )
    final = await api.settle(run["run_id"])
    assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    assert "timeout_s" in final["outcome"]["message"]


async def test_7_time_parked_for_a_human_is_not_active_time(api: Api) -> None:
    budget = 2.0
    # An agent that parks at once: the demo's own active time came near the budget on a
    # loaded machine, and the run ran out of it for that, not for the wait.
    run = await api.create(
        agent_id="second_guesser", input="wire 7", options={"budget": {"timeout_s": budget}}
    )
    run_id = run["run_id"]
    await api.wait_event(run_id, lambda e: e["data"].get("to") == "waiting_human")
    parked = (await api.client.get(f"/runs/{run_id}")).json()
    await asyncio.sleep(budget + 0.5)  # the human takes longer than the whole budget
    approved = await api.decide(run_id, parked["pending_approval"]["approval_id"], "approve")
    assert approved.is_success, approved.text

    final = await api.settle(run_id)
    assert final["state"] == "succeeded", (final["outcome"], final["usage"])
    assert 0 < final["usage"]["active_s"] < budget


async def test_7_cancel_with_compensation_records_what_ran(api: Api) -> None:
    run = await api.create(agent_id="slow_worker", input="sleep 30")
    run_id = run["run_id"]
    await api.wait_event(run_id, lambda e: e["type"] == "action" and e["data"]["tool"] == "sleep")
    resp = await api.client.post(
        f"/runs/{run_id}/cancel", json={"reason": "undo it", "compensate": True}
    )
    outcome = resp.json()["outcome"]
    calls = {c["tool"]: c for c in (await api.client.get(f"/runs/{run_id}/tool-calls")).json()}
    counter_id = calls["counter"]["tool_call_id"]
    assert outcome["side_effects"] == [counter_id]
    assert outcome["compensations"] == [counter_id]
    assert calls["counter"]["compensated"] is True
    assert counter_lines(api.settings.data_dir) == [f"{counter_id} once", f"{counter_id} undo"]


async def test_circuit_opens_after_repeated_unavailability(api: Api) -> None:
    from runtime.breaker import BREAKERS

    BREAKERS.threshold, saved = 2, BREAKERS.threshold
    try:
        for _ in range(3):
            run = await api.create(agent_id="broken", input="x")
            final = await api.settle(run["run_id"])
            assert final["outcome"]["code"] == "TOOL_UNAVAILABLE"
    finally:
        BREAKERS.threshold = saved
    # Two calls of 3 attempts each reached the tool; the third failed fast, untouched.
    assert len((api.settings.data_dir / "flaky.log").read_text().splitlines()) == 6
    assert "circuit open" in final["outcome"]["message"]
