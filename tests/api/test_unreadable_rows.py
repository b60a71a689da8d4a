"""A stored row that no longer validates (a value an older version wrote, a hand edit):
the audit surface shows it in a marked, unreadable form (its keys and status as stored)
beside the rest of the run's record, rather than failing the whole response with a 500.
The run that broke on it is the one an auditor most needs to read."""

from __future__ import annotations

from server.client_render import ASCII, Renderer
from tests.api.conftest import Api
from tests.api.helpers import corrupt, parked_demo_run, problem, unreadable
from tests.auth import MGR


async def test_a_row_that_no_longer_validates_is_shown_marked(api: Api) -> None:
    run_id, approval_id, _ = await parked_demo_run(api)
    calls = (await api.client.get(f"/runs/{run_id}/tool-calls")).json()
    assert len(calls) >= 2
    broken = calls[0]["tool_call_id"]
    await corrupt(api, "tool_calls", "status = 'exploded'", "tool_call_id = ?", broken)
    await corrupt(api, "approvals", "status = 'mislaid'", "approval_id = ?", approval_id)
    await corrupt(api, "steps", "decision = ?", "run_id = ? AND step_index = 0", "{}", run_id)

    listed = await api.client.get(f"/runs/{run_id}/tool-calls")
    steps = await api.client.get(f"/runs/{run_id}/steps")
    trace = await api.client.get(f"/runs/{run_id}/trace")

    assert (listed.status_code, steps.status_code, trace.status_code) == (200, 200, 200)
    shown = listed.json()
    assert [c["tool_call_id"] for c in shown] == [c["tool_call_id"] for c in calls]
    [bad] = unreadable(shown)
    assert set(bad) == {"unreadable", "problems", "tool_call_id", "run_id", "status"}  # no args
    assert (bad["tool_call_id"], bad["run_id"], bad["status"]) == (broken, run_id, "exploded")
    assert [p.split(":")[0] for p in bad["problems"]] == ["status"]
    assert "exploded" not in " ".join(bad["problems"])  # what is wrong, never the value
    assert shown[1:] == calls[1:]  # the others as before
    [step] = unreadable(steps.json())
    assert (step["run_id"], step["step_index"]) == (run_id, 0)
    assert all(p.startswith("decision") for p in step["problems"])

    record = trace.json()
    assert unreadable(record["tool_calls"]) == [bad]
    assert unreadable(record["steps"]) == [step]
    [approval] = unreadable(record["approvals"])
    assert approval["approval_id"] == approval_id and approval["status"] == "mislaid"
    assert set(approval) == {
        "unreadable",
        "problems",
        "approval_id",
        "run_id",
        "tool_call_id",
        "status",
    }
    assert record["run"]["state"] == "waiting_human" and record["events"]
    # The CLI's trace shows them so, not as rows of "None"s.
    text = "\n".join(Renderer(ASCII).trace(record))
    assert f"  {broken} exploded UNREADABLE: status: Input should be" in text
    assert f"  {approval_id} mislaid UNREADABLE: status: " in text
    assert "  #0 UNREADABLE: decision" in text


async def test_an_approval_that_no_longer_validates_is_listed_marked_and_not_decided(
    api: Api,
) -> None:
    """One such row made the tenant's whole inbox a 500 (and a decision on it too):
    the inbox lists it marked; a decision is refused, nobody seeing what it would
    approve; the run is cancelled as any other."""
    run_id, approval_id, _ = await parked_demo_run(api)
    await corrupt(api, "approvals", "args = ?", "approval_id = ?", "[1]", approval_id)

    for query in ("", f"?run_id={run_id}"):
        inbox = await api.client.get(f"/approvals{query}", headers=MGR)
        assert inbox.status_code == 200, inbox.text
        [bad] = unreadable(inbox.json())
        assert (bad["approval_id"], bad["run_id"], bad["status"]) == (
            approval_id,
            run_id,
            "pending",
        )
        assert [p.split(":")[0] for p in bad["problems"]] == ["args"]

    as_starter = await api.client.post(
        f"/runs/{run_id}/approvals/{approval_id}", json={"decision": "approve"}
    )
    problem(as_starter, 403, "ROLE_REQUIRED")  # who may decide is checked first, as ever
    refused = problem(await api.decide(run_id, approval_id, "approve"), 409, "RUN_STATE_CONFLICT")
    assert approval_id in refused["detail"] and "args" in refused["detail"]
    assert (await api.client.get(f"/runs/{run_id}")).json()["state"] == "waiting_human"

    cancelled = await api.client.post(f"/runs/{run_id}/cancel", json={"reason": "unreadable"})
    assert cancelled.status_code in (200, 202), cancelled.text
    await api.wait_event(run_id, lambda e: e["data"].get("to") == "failed")
    expired = await api.client.get(f"/approvals?state=expired&run_id={run_id}", headers=MGR)
    assert expired.status_code == 200, expired.text
    [bad] = unreadable(expired.json())
    assert (bad["approval_id"], bad["status"]) == (approval_id, "expired")
