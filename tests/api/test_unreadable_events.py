"""An event whose stored row no longer validates (a type outside the vocabulary, data
that is not an object, a timestamp that is not one): every reader of the audit
surface shows it in its marked, unreadable form (its run, seq and type as stored),
in its place in the log, rather than a 500, a trace cut off mid-JSON or a stream
that drops at it and drops again at every reconnect."""

from __future__ import annotations

import asyncio
import io
import json
from argparse import Namespace
from collections.abc import Iterator
from typing import Any

import pytest

from server.cli_client import Cli
from server.client import SseParser
from server.client_render import ASCII, Printer, Renderer
from tests.api.conftest import Api
from tests.api.helpers import corrupt, parked_demo_run, unreadable
from tests.auth import bearer

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
    # The CLI's trace marks them, and takes no state from the one that was a state event.
    text = "\n".join(Renderer(ASCII).trace(record))
    assert "exploded UNREADABLE: type: Input should be" in text
    assert f"{before[3]['type']} UNREADABLE: data: Input should be a valid dictionary" in text
    was = [e["data"]["to"] for e in before[:-1] if e["type"] == "state"][-1]
    last = text.splitlines()[-1]
    assert last.startswith(f"  [{before[-1]['seq']:>3}] {was} ")
    assert "state UNREADABLE: ts: Input should be a valid datetime" in last


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


class Replay:
    """The CLI client's side of a stream the server sent: its events as parsed, the run."""

    def __init__(self, sse: str, run: dict[str, Any]) -> None:
        self.sse, self.run = sse, run

    def events(self, run_id: str, after: int = 0, **_: Any) -> Iterator[dict[str, Any]]:
        yield from SseParser().feed(self.sse.splitlines())

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self.run


async def test_the_cli_follows_a_stream_with_an_unreadable_event_marking_it(api: Api) -> None:
    run = await api.create(agent_id="typo_fixer", input="echo")
    run_id = run["run_id"]
    ended = (await api.client.get(f"/runs/{run_id}", headers={"Prefer": "wait=30"})).json()
    before = await api.events(run_id)
    first_state = before[0]["seq"]
    await break_events(api, run_id, first_state + 1, first_state + 2, before[-1]["seq"])
    sse = await api.client.get(f"/runs/{run_id}/events", headers=SSE)

    cli = Cli.__new__(Cli)  # no server of its own: the stream above, replayed
    out = io.StringIO()
    cli.args, cli.json, cli.printer = Namespace(), False, Printer(out, io.StringIO())
    cli.client, cli.render = Replay(sse.text, ended), Renderer(ASCII)  # type: ignore[assignment]
    assert cli.follow(run_id) == ended

    lines = out.getvalue().splitlines()
    assert len(lines) == len(before)
    marked = [line for line in lines if "UNREADABLE" in line]
    assert len(marked) == 3
    assert marked[0].startswith(f"[{first_state + 1:>3}] pending ")
    assert "x exploded UNREADABLE: type: " in marked[0]
    assert "UNREADABLE: data: " in marked[1]
    # The run's state as the readable events tell it, not "None" from the unreadable one.
    was = [e["data"]["to"] for e in before[:-1] if e["type"] == "state"][-1]
    assert lines[-1].startswith(f"[{before[-1]['seq']:>3}] {was} ")
    assert "x state UNREADABLE: ts: " in lines[-1]


async def test_a_run_with_an_unreadable_event_is_still_failed_as_read(api: Api) -> None:
    """Ending a run reads its log for the handoffs left open: one event that no longer
    validates made every failure of the run unrecordable, so a cancel failed it unread
    (every side effect listed as one that may have happened, the handoff unanswered)."""
    run = await api.create(agent_id="delegator", input="slow_worker sleep 30")
    run_id = run["run_id"]
    await api.wait_event(run_id, lambda e: e["type"] == "action" and e["data"]["tool"] == "sleep")
    await break_events(api, run_id, 1)
    resp = await api.client.post(f"/runs/{run_id}/cancel", json={"reason": "stop"})
    final = resp.json()
    assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_CANCELLED"
    assert "could not be read" not in final["outcome"]["message"]
    calls = {c["tool"]: c for c in (await api.client.get(f"/runs/{run_id}/tool-calls")).json()}
    assert final["outcome"]["side_effects"] == [calls["counter"]["tool_call_id"]]
    events = await api.events(run_id)
    handoff = [e for e in events if "handoff" in e.get("data", {})]
    assert [(e["type"], e["data"]["handoff"]["phase"]) for e in handoff] == [
        ("action", "start"),
        ("result", "return"),
    ]
    assert handoff[1]["data"]["error"]["code"] == "RUN_CANCELLED"


async def test_a_handoff_event_without_its_fields_is_passed_over_when_failing(api: Api) -> None:
    """A readable ``action`` of a handoff that a hand edit left without its agents: no
    answer can be made of it, and the failure is recorded all the same (it raised)."""
    run = await api.create(agent_id="delegator", input="slow_worker sleep 30")
    run_id = run["run_id"]
    start = await api.wait_event(run_id, lambda e: e["type"] == "action" and "handoff" in e["data"])
    await api.wait_event(run_id, lambda e: e["type"] == "action" and e["data"]["tool"] == "sleep")
    emptied = json.dumps({**start["data"], "handoff": {"phase": "start"}})
    await corrupt(
        api, "events", "data = ?", "run_id = ? AND seq = ?", emptied, run_id, start["seq"]
    )
    final = (await api.client.post(f"/runs/{run_id}/cancel", json={"reason": "stop"})).json()
    assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_CANCELLED"
    assert "could not be read" not in final["outcome"]["message"]


async def test_an_artifact_whose_event_no_longer_validates_is_served_as_opaque_bytes(
    api: Api,
) -> None:
    """The run's ``artifact`` event names the bytes and the tenant's name and media type
    for them: one that no longer validates was a 500 on every read of them. The bytes
    are still the tenant's, sent as an attachment of no known type under their id."""
    run_id, _, artifact_id = await parked_demo_run(api)
    before = await api.client.get(f"/artifacts/{artifact_id}")
    assert before.status_code == 200 and before.headers["content-type"].startswith("text/")
    await corrupt(
        api, "events", "data = ?", "run_id = ? AND type = 'artifact'", '{"name": 1}', run_id
    )

    after = await api.client.get(f"/artifacts/{artifact_id}")

    assert after.status_code == 200, after.text
    assert after.content == before.content
    assert after.headers["content-type"] == "application/octet-stream"
    assert after.headers["content-disposition"].startswith("attachment")
    assert artifact_id.replace(":", "-") in after.headers["content-disposition"]
    assert after.headers["etag"] == before.headers["etag"]
    stranger = bearer(user="u-eve", tenant="other-co", roles=["admin"])
    other = await api.client.get(f"/artifacts/{artifact_id}", headers=stranger)
    assert other.status_code == 404  # to another tenant as absent as before


@pytest.mark.parametrize("media_type", ["text/plain; charset=報告", "text/plain\r\nX-Evil: 1"])
async def test_an_artifact_stored_under_a_media_type_no_header_carries_is_served_opaque(
    api: Api, media_type: str
) -> None:
    """Written before media types were checked (runtime.artifact_naming): the type as
    stored was a 500 (not Latin-1) or a dropped connection (a line break) on every read
    of the bytes. They are served under their name, as bytes of no known type."""
    run_id, _, artifact_id = await parked_demo_run(api)
    before = await api.client.get(f"/artifacts/{artifact_id}")
    [event] = [e for e in await api.events(run_id) if e["type"] == "artifact"]
    stored = json.dumps({**event["data"], "media_type": media_type})
    await corrupt(api, "events", "data = ?", "run_id = ? AND type = 'artifact'", stored, run_id)

    after = await api.client.get(f"/artifacts/{artifact_id}")

    assert after.status_code == 200, after.text
    assert after.content == before.content
    assert after.headers["content-type"] == "application/octet-stream"
    assert after.headers["content-disposition"] == before.headers["content-disposition"].replace(
        "inline", "attachment"
    )


async def test_an_artifact_whose_own_row_no_longer_validates_is_served_as_named(
    api: Api,
) -> None:
    """Serving the bytes reads them alone, not the row's metadata (the first writer's,
    which the response never uses): a row edited by hand was a 500 on every read."""
    _, _, artifact_id = await parked_demo_run(api)
    before = await api.client.get(f"/artifacts/{artifact_id}")
    await corrupt(api, "artifacts", "created_at = 'yesterday'", "artifact_id = ?", artifact_id)

    after = await api.client.get(f"/artifacts/{artifact_id}")

    assert after.status_code == 200, after.text
    assert after.content == before.content
    shown = ("content-type", "content-disposition", "etag")
    assert [after.headers[h] for h in shown] == [before.headers[h] for h in shown]


async def test_an_artifact_named_by_another_run_of_the_tenant_keeps_its_name(api: Api) -> None:
    """The same bytes written by two runs of the tenant: one run's event no longer
    validates, the other's still names them."""
    first, _, artifact_id = await parked_demo_run(api)
    second, _, again = await parked_demo_run(api)
    assert again == artifact_id  # the demo's report is the same bytes each time
    before = await api.client.get(f"/artifacts/{artifact_id}")
    where = "run_id = ? AND type = 'artifact'"
    read_first, other = sorted((first, second))  # the store reads the runs' events so
    await corrupt(api, "events", "data = ?", where, '{"name": 1}', read_first)

    named = await api.client.get(f"/artifacts/{artifact_id}")

    assert named.headers["content-type"] == before.headers["content-type"]
    assert named.headers["content-disposition"] == before.headers["content-disposition"]
    await corrupt(api, "events", "data = ?", where, '{"name": 1}', other)
    unnamed = await api.client.get(f"/artifacts/{artifact_id}")
    assert unnamed.headers["content-type"] == "application/octet-stream"
