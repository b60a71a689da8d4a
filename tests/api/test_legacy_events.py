"""Events the first versions stored with a type no longer in the vocabulary: a
handoff's start and return were a ``handoff`` event then (9b42d48 made them an
``action`` and a ``result``, and no migration rewrote the rows). A run recorded then
must still be explainable: every reader shows them as the action and result a handoff
is now, not as unreadable rows whose content is hidden."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.api.conftest import Api
from tests.api.helpers import corrupt
from tests.api.test_handoff import handoff_events
from tests.api.test_unreadable_events import frames


async def as_first_versions_wrote(api: Api, run_id: str, event: dict[str, Any]) -> None:
    """The handoff event ``event`` stored as the first versions wrote it."""
    data, move = event["data"], event["data"]["handoff"]
    legacy: dict[str, Any] = {
        "phase": move["phase"],
        "handoff_id": data["tool_call_id"],
        "from_agent": move["from_agent"],
        "to_agent": move["to_agent"],
        "step_index": move["step_index"],
        "depth": move["depth"],
    }
    if move["phase"] == "start":
        legacy["task"] = move["task"]
    else:
        legacy.update(summary=data["output"], artifacts=move["artifacts"])
    await corrupt(
        api,
        "events",
        f"type = 'handoff', data = '{json.dumps(legacy)}'",
        "run_id = ? AND seq = ?",
        run_id,
        event["seq"],
    )


async def test_a_first_versions_handoff_reads_as_an_action_and_a_result(api: Api) -> None:
    run = await api.create(agent_id="delegator", input="slow_worker sleep 0.01")
    assert (await api.settle(run["run_id"]))["state"] == "succeeded"
    run_id = run["run_id"]
    now = await api.events(run_id)
    start, back = handoff_events(now)
    for event in (start, back):
        await as_first_versions_wrote(api, run_id, event)

    shown = await api.events(run_id)
    resp = await asyncio.wait_for(
        api.client.get(f"/runs/{run_id}/events", headers={"Accept": "text/event-stream"}), 10
    )
    streamed = frames(resp.text)
    traced = (await api.client.get(f"/runs/{run_id}/trace")).json()["events"]

    assert not [e for e in shown + traced if e.get("unreadable")]
    old_start, old_back = handoff_events(shown)
    assert (old_start["seq"], old_back["seq"]) == (start["seq"], back["seq"])
    assert (old_start["type"], old_back["type"]) == ("action", "result")
    for old, new in ((old_start, start), (old_back, back)):
        for key in ("tool_call_id", "tool"):
            assert old["data"][key] == new["data"][key]
        assert old["data"]["handoff"]["stored_as"] == "handoff"
        assert old["data"]["handoff"]["phase"] == new["data"]["handoff"]["phase"]
    assert old_start["data"]["tool"] == "handoff_to_slow_worker"
    assert old_back["data"]["status"] == "succeeded" and old_back["data"]["output"] == "slept"
    assert old_start["data"]["handoff"]["task"] == "sleep 0.01"
    # The stream and the trace read them as the page does.
    assert [(seq, name, data) for seq, name, data in streamed if seq == start["seq"]] == [
        (start["seq"], "action", old_start)
    ]
    assert [e for e in traced if e["seq"] in (start["seq"], back["seq"])] == [old_start, old_back]


@pytest.mark.parametrize(
    "data",
    [
        {"phase": "sideways", "handoff_id": "ho-1", "to_agent": "a"},
        {"phase": "start", "handoff_id": "ho-1"},  # to whom, not said
        {"phase": "return", "handoff_id": 7, "from_agent": "a"},
    ],
)
async def test_a_handoff_event_the_first_versions_did_not_write_stays_unreadable(
    api: Api, data: dict[str, Any]
) -> None:
    run = await api.create(agent_id="delegator", input="slow_worker sleep 0.01")
    assert (await api.settle(run["run_id"]))["state"] == "succeeded"
    start, _ = handoff_events(await api.events(run["run_id"]))
    await corrupt(
        api,
        "events",
        f"type = 'handoff', data = '{json.dumps(data)}'",
        "run_id = ? AND seq = ?",
        run["run_id"],
        start["seq"],
    )

    [shown] = [e for e in await api.events(run["run_id"]) if e["seq"] == start["seq"]]

    assert shown["unreadable"] is True and shown["type"] == "handoff"
    assert "data" not in shown
