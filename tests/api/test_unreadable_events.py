"""An event whose stored row no longer validates (a type outside the vocabulary, data
that is not an object, a timestamp that is not one): every reader of the audit
surface shows it in its marked, unreadable form (its run, seq and type as stored),
in its place in the log, rather than a 500, a trace cut off mid-JSON or a stream
that drops at it and drops again at every reconnect."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.api.conftest import Api
from tests.api.helpers import corrupt, parked_demo_run, unreadable

SSE = {"Accept": "text/event-stream"}
MARKED = {"unreadable", "problems", "run_id", "seq", "type"}
"""All an unreadable event shows: none of its data."""


Frame = tuple[int, str, dict[str, Any]]


def frames(text: str) -> list[Frame]:
    """(id, event name, data) of each event an SSE body holds."""
    out = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in fields:
            out.append((int(fields["id"]), fields["event"], json.loads(fields["data"])))
    return out


async def break_events(api: Api, run_id: str, *seqs: int) -> None:
    """The events at ``seqs``: the first of a type outside the vocabulary, the second
    with data that is not an object, the third with a timestamp that is not one."""
    sets = ("type = 'exploded'", "data = '[1, 2]'", "ts = 'yesterday'")
    for seq, change in zip(seqs, sets, strict=False):
        await corrupt(api, "events", change, "run_id = ? AND seq = ?", run_id, seq)


async def stream(api: Api, run_id: str, **headers: str) -> list[Frame]:
    # An ended run's stream replays its log and closes; a stream that waited for its
    # keepalive (15 s) to notice would time out here.
    resp = await asyncio.wait_for(
        api.client.get(f"/runs/{run_id}/events", headers={**SSE, **headers}), 10
    )
    assert resp.status_code == 200, resp.text
    return frames(resp.text)


async def test_an_event_page_shows_an_event_that_no_longer_validates_marked(api: Api) -> None:
    run_id, _, _ = await parked_demo_run(api)
    before = await api.events(run_id)
    broken = [before[1]["seq"], before[3]["seq"], before[5]["seq"]]
    await break_events(api, run_id, *broken)

    after = await api.events(run_id)

    assert [e["seq"] for e in after] == [e["seq"] for e in before]
    marked = unreadable(after)
    assert [e["seq"] for e in marked] == broken
    assert all(set(e) == MARKED and e["run_id"] == run_id for e in marked)
    assert [e["type"] for e in marked] == ["exploded", before[3]["type"], before[5]["type"]]
    assert [[p.split(":")[0] for p in e["problems"]] for e in marked] == [
        ["type"],
        ["data"],
        ["ts"],
    ]
    problems = " ".join(p for e in marked for p in e["problems"])
    assert "exploded" not in problems and "yesterday" not in problems  # never a value
    assert [e for e in after if not e.get("unreadable")] == [
        e for e in before if e["seq"] not in broken
    ]
    # A page may begin and end at one.
    page = await api.client.get(
        f"/runs/{run_id}/events",
        params={"after": broken[0] - 1, "limit": 1},
        headers={"Accept": "application/json"},
    )
    assert page.json() == [marked[0]] and f"after={broken[0]}" in page.headers["Link"]


async def test_the_trace_is_whole_json_with_an_event_that_no_longer_validates(
    api: Api,
) -> None:
    run_id, _, _ = await parked_demo_run(api)
    before = await api.events(run_id)
    await break_events(api, run_id, before[1]["seq"], before[3]["seq"], before[-1]["seq"])

    resp = await api.client.get(f"/runs/{run_id}/trace")

    assert resp.status_code == 200
    record = json.loads(resp.content)  # whole: its JSON closed
    assert record["events"] == await api.events(run_id)
    assert len(unreadable(record["events"])) == 3


async def test_the_stream_sends_an_event_that_no_longer_validates_marked_and_resumes_past_it(
    api: Api,
) -> None:
    run = await api.create(agent_id="typo_fixer", input="echo")
    run_id = run["run_id"]
    ended = await api.client.get(f"/runs/{run_id}", headers={"Prefer": "wait=30"})
    assert ended.json()["state"] == "succeeded"
    before = await api.events(run_id)
    middle, terminal = before[len(before) // 2]["seq"], before[-1]["seq"]
    # The terminal state event among them: the stream must still end with the run.
    await break_events(api, run_id, middle, terminal)
    # One that validates but names no state it went to is shown as it is, not dropped at.
    await corrupt(api, "events", "data = '{}'", "run_id = ? AND seq = ?", run_id, before[1]["seq"])

    everything = await stream(api, run_id)

    assert [seq for seq, _, _ in everything] == [e["seq"] for e in before]
    marked = [(seq, name, data) for seq, name, data in everything if data.get("unreadable")]
    assert [(seq, name) for seq, name, _ in marked] == [
        (middle, "unreadable"),
        (terminal, "unreadable"),
    ]
    assert [set(data) for _, _, data in marked] == [MARKED, MARKED]
    assert [data["type"] for _, _, data in marked] == ["exploded", "state"]
    types = {e["seq"]: e["type"] for e in before}
    assert all(name == types[seq] for seq, name, data in everything if not data.get("unreadable"))
    # Last-Event-ID resumes at the unreadable event, and past it.
    assert (await stream(api, run_id, **{"Last-Event-ID": str(middle - 1)}))[0] == marked[0]
    resumed = await stream(api, run_id, **{"Last-Event-ID": str(middle)})
    assert [seq for seq, _, _ in resumed] == [e["seq"] for e in before if e["seq"] > middle]
    assert await stream(api, run_id, **{"Last-Event-ID": str(terminal)}) == []
