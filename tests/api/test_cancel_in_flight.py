"""A cancel that cuts a side effect off mid-call (DESIGN §7): the record says whether it
took effect, where the tool can tell (``reconcile``), and compensates it if asked.

``transfer`` (tests.agents) is a non-idempotent call held open for a while: its
effect lands when it starts ("first") or would land when it ends ("last").
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.agents import UNREFUNDABLE, counter_lines, transfer_lines
from tests.api.conftest import Api, make_settings, open_api
from tests.api.helpers import parked_demo_run, problem
from tools.retail import outbox_rows

CUT_S = 3.0
"""The time budget of the runs cut off mid-call: room for the run's own start (claim,
checkpoints, planner: over 0.5 s on a loaded machine) before the call it is about, which
holds on for 30 s."""


def transfer_started(event: dict[str, Any]) -> bool:
    return bool(event["type"] == "action" and event["data"]["tool"] == "transfer")


async def cancel_mid_transfer(
    api: Api, when: str, amount: int = 5, **body: Any
) -> tuple[dict[str, Any], Any]:
    run = await api.create(agent_id="transferrer", input=f"{when} 30 {amount}")
    run_id = run["run_id"]
    await api.wait_event(run_id, transfer_started)
    if when == "first":  # cancel once the effect has landed, not while it is landing
        for _ in range(500):
            if transfer_lines(api.settings.data_dir):
                break
            await asyncio.sleep(0.01)
        assert transfer_lines(api.settings.data_dir)
    resp = await api.client.post(f"/runs/{run_id}/cancel", json={"reason": "stop", **body})
    assert resp.status_code == 200, resp.text
    [call] = (await api.client.get(f"/runs/{run_id}/tool-calls")).json()
    return resp.json(), call


async def final_recovery(api: Api, run_id: str) -> str:
    """The recovery of the run's last error event: what the runtime did about the end."""
    errors = [e for e in await api.events(run_id) if e["type"] == "error"]
    assert errors[-1]["data"]["code"] == "RUN_CANCELLED"
    return str(errors[-1]["data"]["recovery"])


async def test_an_effect_that_took_place_is_recorded_and_compensated(api: Api) -> None:
    final, call = await cancel_mid_transfer(api, "first", compensate=True)

    assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_CANCELLED"
    # The real system says it happened: the ledger records it as done, with its output.
    assert call["status"] == "succeeded" and call["output"] == {"transferred": 5}, final
    assert final["outcome"]["side_effects"] == [call["tool_call_id"]]
    assert final["outcome"]["compensations"] == [call["tool_call_id"]]
    assert call["compensated"] is True
    assert await final_recovery(api, final["run_id"]) == "compensate"
    key = call["idempotency_key"]
    assert transfer_lines(api.settings.data_dir) == [f"{key} 5", f"{key} refund"]


async def test_an_effect_that_did_not_take_place_is_not_reported(api: Api) -> None:
    final, call = await cancel_mid_transfer(api, "last", compensate=True)

    assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_CANCELLED"
    assert call["status"] == "cancelled"
    assert call["error"]["code"] == "RUN_CANCELLED" and call["error"]["took_effect"] is False
    assert final["outcome"]["side_effects"] == []
    assert final["outcome"]["compensations"] == []
    assert await final_recovery(api, final["run_id"]) == "none"  # nothing to undo
    assert transfer_lines(api.settings.data_dir) == []  # and no refund of nothing


async def test_without_compensation_the_effect_is_still_reported(api: Api) -> None:
    final, call = await cancel_mid_transfer(api, "first")

    assert call["status"] == "succeeded"
    assert final["outcome"]["side_effects"] == [call["tool_call_id"]]
    assert final["outcome"]["compensations"] == []
    assert await final_recovery(api, final["run_id"]) == "none"  # the effect stands
    assert transfer_lines(api.settings.data_dir) == [f"{call['idempotency_key']} 5"]
    # Asking for compensation once the cancel is done is too late, and said so: it was
    # answered 200, and nobody ever compensated.
    late = await api.client.post(
        f"/runs/{final['run_id']}/cancel", json={"reason": "undo it", "compensate": True}
    )
    problem(late, 409, "RUN_STATE_CONFLICT")
    # Asking again as the cancel was is answered with the run, as before.
    same = await api.client.post(f"/runs/{final['run_id']}/cancel", json={"reason": "again"})
    assert same.status_code == 200 and same.json()["outcome"]["code"] == "RUN_CANCELLED"


async def test_a_timeout_that_cuts_an_effect_off_records_it_too(api: Api) -> None:
    run = await api.create(
        agent_id="transferrer", input="first 30", options={"budget": {"timeout_s": CUT_S}}
    )
    final = await api.settle(run["run_id"])

    assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    [call] = (await api.client.get(f"/runs/{run['run_id']}/tool-calls")).json()
    assert call["status"] == "succeeded" and call["output"] == {"transferred": 5}, final
    assert final["outcome"]["side_effects"] == [call["tool_call_id"]]


async def test_a_compensation_that_fails_is_on_the_record(api: Api) -> None:
    final, call = await cancel_mid_transfer(api, "first", amount=UNREFUNDABLE, compensate=True)

    assert final["outcome"]["side_effects"] == [call["tool_call_id"]]
    assert final["outcome"]["compensations"] == []  # tried, not done
    assert call["compensated"] is False
    events = (await api.client.get(f"/runs/{final['run_id']}/trace")).json()["events"]
    errors = [e["data"] for e in events if e["type"] == "error"]
    failed = [e for e in errors if e["code"] == "COMPENSATION_FAILED"]
    assert [e["tool_call_id"] for e in failed] == [call["tool_call_id"]]
    assert "refused to refund 13" in failed[0]["message"] and failed[0]["recovery"] == "human"


# The usage a cut-off run ends with (DESIGN §9): what it spent up to the cut, including
# the call cut off mid-flight, which its executor never returned to charge.


async def test_a_cancelled_run_is_charged_for_the_call_it_cut_off(api: Api) -> None:
    run_id = (await api.create(agent_id="transferrer", input="last 30"))["run_id"]
    await api.wait_event(run_id, transfer_started)
    await asyncio.sleep(0.3)
    resp = await api.client.post(f"/runs/{run_id}/cancel", json={"reason": "stop"})
    final = resp.json()

    assert final["outcome"]["code"] == "RUN_CANCELLED"
    assert final["usage"]["steps"] == 1 and final["usage"]["tool_calls"] == 1
    assert 0.3 <= final["usage"]["active_s"] < 30


async def test_a_cut_off_step_charges_its_calls_that_finished_too(api: Api) -> None:
    """The executor charges a step's calls together when it returns: counter finished,
    sleep was cut off, and neither was charged."""
    timed = await api.create(
        agent_id="hurried", input="go 30", options={"budget": {"timeout_s": CUT_S}}
    )
    cancelled = await api.create(agent_id="hurried", input="go 30")
    await api.wait_event(
        cancelled["run_id"], lambda e: e["type"] == "action" and e["data"]["tool"] == "sleep"
    )
    resp = await api.client.post(f"/runs/{cancelled['run_id']}/cancel", json={"reason": "x"})

    for final in (await api.settle(timed["run_id"]), resp.json()):
        calls = (await api.client.get(f"/runs/{final['run_id']}/tool-calls")).json()
        assert {c["tool"]: c["status"] for c in calls} == {
            "counter": "succeeded",
            "sleep": "cancelled",
        }, final["usage"]
        assert final["usage"]["steps"] == 1 and final["usage"]["tool_calls"] == 2, final


async def test_a_run_out_of_time_keeps_what_it_spent(api: Api) -> None:
    """The usage was that of the drive's start, active time aside: the steps and calls
    of the drive that ran out were lost from the run (the checkpoint had them)."""
    run = await api.create(
        agent_id="slow_worker", input="go 30", options={"budget": {"timeout_s": CUT_S}}
    )
    final = await api.settle(run["run_id"])

    assert final["outcome"]["code"] == "RUN_BUDGET_EXCEEDED"
    calls = (await api.client.get(f"/runs/{run['run_id']}/tool-calls")).json()
    assert [(c["tool"], c["status"]) for c in calls] == [
        ("counter", "succeeded"),
        ("sleep", "cancelled"),
    ], final["usage"]
    # Two steps planned, counter charged by its executor, sleep cut off while running.
    assert final["usage"]["steps"] == 2 and final["usage"]["tool_calls"] == 2
    assert final["usage"]["active_s"] >= CUT_S
    # The log says why the sleep stopped, as its ledger row does.
    [cut] = [c for c in calls if c["tool"] == "sleep"]
    [result] = [
        e["data"]
        for e in await api.events(run["run_id"])
        if e["type"] == "result" and e["data"]["tool_call_id"] == cut["tool_call_id"]
    ]
    assert result["error"] == cut["error"] and cut["error"]["code"] == "RUN_BUDGET_EXCEEDED"
    # And the run's error names the call the time ran out in.
    error = next(
        e["data"] for e in reversed(await api.events(run["run_id"])) if e["type"] == "error"
    )
    assert (error["code"], error["tool_call_id"]) == ("RUN_BUDGET_EXCEEDED", cut["tool_call_id"])


async def test_a_publish_cut_off_in_its_thread_never_lands_behind_the_record(api: Api) -> None:
    """The demo's publish inserts in a thread, which a cancel cannot stop: asked at once,
    reconcile said "not queued", the record said so, and the thread queued the email a
    moment later. Its reconcile now voids the key when it finds nothing (``cut_off``)."""
    run_id, approval_id, _ = await parked_demo_run(api)
    db = api.settings.resolved_demo_db
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # a slow real system: the handler's insert waits
    try:
        assert (await api.decide(run_id, approval_id, "approve")).status_code == 202
        await api.wait_event(
            run_id, lambda e: e["type"] == "action" and e["data"]["tool"] == "publish_report"
        )
        cancel = asyncio.create_task(
            api.client.post(f"/runs/{run_id}/cancel", json={"reason": "stop", "compensate": True})
        )
        await asyncio.sleep(0.3)  # the cancel settles the call while the insert still waits
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    final = (await cancel).json()
    await asyncio.sleep(0.5)  # the handler's thread, unblocked, does what it still does

    assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_CANCELLED"
    calls = (await api.client.get(f"/runs/{run_id}/tool-calls")).json()
    [call] = [c for c in calls if c["tool"] == "publish_report"]
    rows = outbox_rows(db)
    assert [r for r in rows if r["status"] == "queued"] == []  # nothing goes out
    if call["status"] == "succeeded":  # the insert came first: on the record, compensated
        assert final["outcome"]["compensations"] == [call["tool_call_id"]]
        assert [(r["idempotency_key"], r["subject"] != "") for r in rows] == [
            (call["idempotency_key"], True)
        ]
    else:  # reconcile came first: the key is void, and the late insert queued nothing
        assert call["status"] == "cancelled" and call["error"]["took_effect"] is False
        assert final["outcome"]["side_effects"] == []
        assert [(r["idempotency_key"], r["subject"]) for r in rows] == [
            (call["idempotency_key"], "")
        ]


async def test_a_cancel_the_graph_swallowed_still_stops_the_run(api: Api) -> None:
    """A cancel's task.cancel() can be swallowed by the code it lands in (the race probe
    saw LangGraph and psycopg do it): the graph went on, parked or took another step,
    and the cancel answered 202 was never carried out."""
    run = await api.create(agent_id="swallower", input="think 1.5")
    run_id = run["run_id"]
    await api.wait_event(run_id, lambda e: e["data"].get("to") == "planning")
    await asyncio.sleep(0.2)  # inside the planner's thinking

    resp = await api.client.post(f"/runs/{run_id}/cancel", json={"reason": "stop"})

    assert resp.status_code in (200, 202), resp.text
    final = await api.settle(run_id)
    assert (final["state"], final["outcome"]["code"]) == ("failed", "RUN_CANCELLED"), final
    assert counter_lines(api.settings.data_dir) == [], "nothing runs after a cancel"


async def test_a_drive_whose_lease_is_taken_while_it_finishes_a_cancel_stops_acting(
    database_url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused past its lease while finishing a cancel, a worker went on asking the real
    system (a tool's reconcile) for a run another worker held by then, and asyncio
    logged its LeaseLost as an error nobody retrieved (the chaos probe)."""
    monkeypatch.setenv("TEST_RECONCILE_S", "2")
    async with open_api(make_settings(database_url, data_dir, lease_seconds=1.5)) as api:
        run_id = (await api.create(agent_id="transferrer", input="last 30"))["run_id"]
        await api.wait_event(run_id, transfer_started)
        cancel = asyncio.create_task(
            api.client.post(f"/runs/{run_id}/cancel", json={"reason": "stop"})
        )
        reconciling = data_dir / "reconcile.log"
        engine = api.engine
        for _ in range(300):  # until the cancel's drive is in the slow reconcile
            if run_id in engine._cancelling:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        # Another worker takes the run over, as after a pause past the lease.
        store = api.engine_services.store
        async with store.tx() as tx:
            await tx.execute(
                "UPDATE runs SET lease_owner = 'thief', lease_version = lease_version + 1 "
                "WHERE run_id = ?",
                (run_id,),
            )
        for _ in range(300):  # the heartbeat finds it and stops the drive
            if run_id not in engine.drives:
                break
            await asyncio.sleep(0.02)
        assert run_id not in engine.drives
        await asyncio.sleep(2.5)  # past the reconcile it had started

        assert not reconciling.exists(), "the reconcile went on for a run it no longer held"
        cancel.cancel()
        await asyncio.gather(cancel, return_exceptions=True)
