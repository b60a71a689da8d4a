"""A rejection whose tool policy says "replan" leaves waiting_human by `rejected` (DESIGN §3)."""

from __future__ import annotations

import itertools

from tests.agents import transfer_lines
from tests.api.conftest import Api, states


async def parked_approval(api: Api, run_id: str) -> str:
    """The approval the run waits for, once parked (a decision before it parks is
    picked up while executing: the run never enters waiting_human)."""
    await api.wait_event(run_id, lambda e: e["data"].get("to") == "waiting_human")
    approval_id: str = (await api.client.get(f"/runs/{run_id}")).json()["pending_approval"][
        "approval_id"
    ]
    return approval_id


async def test_a_replanned_rejection_is_fired_as_rejected_and_the_run_goes_on(api: Api) -> None:
    run = await api.create(agent_id="second_guesser", input="wire 7")
    run_id = run["run_id"]
    approval_id = await parked_approval(api, run_id)

    resp = await api.decide(run_id, approval_id, "reject")

    assert resp.status_code == 202, resp.text
    done = await api.settle(run_id)
    assert done["state"] == "succeeded", done
    assert done["result"]["answer"] == "transfer done"
    events = await api.events(run_id)
    moves = [
        (e["data"]["from"], e["data"]["to"], e["data"]["trigger"])
        for e in events
        if e["type"] == "state"
    ]
    assert ("waiting_human", "planning", "rejected") in moves
    # The chain holds: every state event leaves the state the previous one reached.
    assert all(a[1] == b[0] for a, b in itertools.pairwise(moves))
    assert states(events)[-1] == "succeeded"
    # The rejected wire never ran; the transfer the planner chose instead did, once.
    assert [line.split()[1] for line in transfer_lines(api.settings.data_dir)] == ["7"]


async def test_a_plain_rejection_still_fails_the_run_by_rejected(api: Api) -> None:
    run = await api.create()
    run_id = run["run_id"]
    approval_id = await parked_approval(api, run_id)

    await api.decide(run_id, approval_id, "reject")

    done = await api.settle(run_id)
    assert (done["state"], done["outcome"]["code"]) == ("failed", "APPROVAL_REJECTED")
    last = (await api.events(run_id))[-1]["data"]
    assert (last["from"], last["to"], last["trigger"]) == ("waiting_human", "failed", "rejected")
