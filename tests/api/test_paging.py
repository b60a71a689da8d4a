"""Long lists come in pages: the approval inbox, a run's event log as JSON, a user's
memory, the audit trail.

Each body stays what it was (a JSON list, as DESIGN §5 has them; memory a map by key);
a page that is not the last says where the next one is in a ``Link: <…>; rel="next"``
header (RFC 8288), and a cursor of another list is a 422.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest

from runtime.memory import Memory
from runtime.store.codec import encode_cursor
from tests.api.conftest import Api
from tests.api.helpers import parked_demo_run, problem
from tests.auth import OPS_TENANT, OPS_USER, bearer

JSON = {"Accept": "application/json"}


def next_url(resp: httpx.Response) -> str | None:
    link = resp.headers.get("Link")
    if link is None:
        return None
    found = re.fullmatch(r'<([^>]+)>; rel="next"', link)
    assert found, link
    return found.group(1)


async def follow(api: Api, url: str, headers: dict[str, str] | None = None) -> list[list[Any]]:
    """Every page from ``url`` on, following the Link headers."""
    pages: list[list[Any]] = []
    next_page: str | None = url
    while next_page is not None:
        resp = await api.client.get(next_page, headers=headers)
        assert resp.status_code == 200, resp.text
        pages.append(resp.json())
        next_page = next_url(resp)
    return pages


async def test_the_approval_inbox_pages_oldest_first(api: Api) -> None:
    parked = [(await parked_demo_run(api))[1] for _ in range(3)]

    pages = await follow(api, "/approvals?limit=2")

    assert [len(p) for p in pages] == [2, 1]
    assert [a["approval_id"] for p in pages for a in p] == parked
    whole = (await api.client.get("/approvals")).json()
    assert [a["approval_id"] for a in whole] == parked
    assert next_url(await api.client.get("/approvals")) is None


async def test_the_inbox_lists_approvals_in_any_state_given(api: Api) -> None:
    """``state`` given more than once: any of them, paged in one order (it took the last)."""
    (r1, approved, _), (r2, rejected, _), (_, pending, _) = [
        await parked_demo_run(api) for _ in range(3)
    ]
    assert (await api.decide(r1, approved, "approve")).status_code == 202
    assert (await api.decide(r2, rejected, "reject")).status_code == 202

    async def listed(*states: str) -> list[str]:
        query = "&".join(f"state={s}" for s in states)
        pages = await follow(api, f"/approvals?limit=1&{query}")
        return [a["approval_id"] for p in pages for a in p]

    assert await listed("approved", "rejected") == [approved, rejected]
    assert await listed("rejected", "pending", "approved") == [approved, rejected, pending]
    assert await listed("pending") == [pending]
    whole = (await api.client.get("/approvals")).json()  # pending, unless asked otherwise
    assert [a["approval_id"] for a in whole] == [pending]


async def test_a_bad_cursor_is_a_422(api: Api) -> None:
    problem(await api.client.get("/approvals?cursor=not-a-cursor"), 422, "VALIDATION_ERROR")


async def test_the_event_log_pages_by_seq(api: Api) -> None:
    run_id, _, _ = await parked_demo_run(api)
    whole = (await api.client.get(f"/runs/{run_id}/events", headers=JSON)).json()
    assert len(whole) > 7

    pages = await follow(api, f"/runs/{run_id}/events?limit=3", JSON)

    assert all(len(p) == 3 for p in pages[:-1]) and 1 <= len(pages[-1]) <= 3
    assert [e for p in pages for e in p] == whole
    # Relative to the request: a Host header cannot put another site's name in it.
    spoofed = await api.client.get(
        f"/runs/{run_id}/events?limit=3", headers={**JSON, "Host": "evil.example"}
    )
    assert next_url(spoofed) == f"/runs/{run_id}/events?limit=3&after=3"
    after = await api.client.get(f"/runs/{run_id}/events?after=5&limit=2", headers=JSON)
    assert [e["seq"] for e in after.json()] == [6, 7]
    assert after.headers["vary"] == "Accept"  # the same URL also streams
    problem(
        await api.client.get(f"/runs/{run_id}/events?limit=0", headers=JSON),
        422,
        "VALIDATION_ERROR",
    )


async def test_the_trace_is_the_whole_record_however_long(api: Api) -> None:
    from runtime.events import EventType
    from server.api.trace import EVENTS_PER_CHUNK, Trace

    run_id, _, _ = await parked_demo_run(api)
    store = api.engine_services.store
    for i in range(EVENTS_PER_CHUNK + 300):  # more than one chunk of the stream
        await store.append_event(run_id, EventType.ERROR, {"i": i})
    last = (await store.list_events(run_id, 0, limit=100_000))[-1].seq

    resp = await api.client.get(f"/runs/{run_id}/trace")

    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    trace = Trace.model_validate(resp.json())
    assert [e.seq for e in trace.events] == list(range(1, last + 1))
    assert trace.run.run_id == run_id and trace.approvals and trace.steps


async def test_the_trace_is_the_record_of_one_instant(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events appended while the trace's head is read (the run moving on) are not in
    its log: the log ends where the run it shows stood."""
    from runtime.events import EventType
    from runtime.store import records

    run_id, _, _ = await parked_demo_run(api)
    store = api.engine_services.store
    read_calls = records.shown_tool_call_rows
    late: list[asyncio.Task[int | None]] = []

    async def calls_while_the_log_grows(tx: Any, of: str) -> list[Any]:
        late.append(asyncio.create_task(store.append_event(run_id, EventType.ERROR, {"late": 1})))
        await asyncio.sleep(0.2)
        return await read_calls(tx, of)

    monkeypatch.setattr(records, "shown_tool_call_rows", calls_while_the_log_grows)
    resp = await api.client.get(f"/runs/{run_id}/trace")
    assert late, "the trace reads the record's tool calls"
    late_seq = await late[0]
    assert late_seq is not None

    trace = resp.json()
    assert [e["seq"] for e in trace["events"]] == list(range(1, late_seq))
    assert trace["events"][-1]["data"]["to"] == trace["run"]["state"] == "waiting_human"


async def test_a_users_memory_pages(api: Api) -> None:
    assert api.engine.memory is not None
    mine = Memory(api.engine.memory, OPS_TENANT, OPS_USER)
    for i in range(5):
        await mine.put(f"k{i}", {"v": i})

    resp = await api.client.get("/memory?limit=2")
    pages: list[dict[str, Any]] = [resp.json()]
    while (url := next_url(resp)) is not None:
        resp = await api.client.get(url)
        assert resp.status_code == 200, resp.text
        pages.append(resp.json())

    assert [len(p) for p in pages] == [2, 2, 1]
    keys = [k for p in pages for k in p]
    assert sorted(keys) == [f"k{i}" for i in range(5)]
    assert next_url(await api.client.get("/memory")) is None
    # Another list's cursor, or one made up, is refused.
    inbox_cursor = encode_cursor("2026-01-01T00:00:00Z", "ap-1")
    made_up = [encode_cursor("memory", n) for n in ("-1", "²", "10000000", "")]
    for bad in ["not-a-cursor", inbox_cursor, *made_up]:
        problem(await api.client.get("/memory", params={"cursor": bad}), 422, "VALIDATION_ERROR")


async def test_the_audit_trail_pages_oldest_first(api: Api) -> None:
    store = api.engine_services.store
    for i in range(3):
        await store.record_audit(OPS_TENANT, "cli", "key.revoke", f"key-{i}")
    await store.record_audit("another-tenant", "cli", "key.revoke", "not-ours")
    admin = bearer(roles=["admin"])

    resp = await api.client.get("/audit?limit=2", headers=admin)
    pages = [resp.json()]
    while (url := next_url(resp)) is not None:
        resp = await api.client.get(url, headers=admin)
        pages.append(resp.json())

    assert [[e["subject"] for e in p] for p in pages] == [["key-0", "key-1"], ["key-2"]]
    only = await api.client.get("/audit", params={"action": "memory.forget"}, headers=admin)
    assert only.json() == []
    problem(
        await api.client.get("/audit?action=drop.tables", headers=admin), 422, "VALIDATION_ERROR"
    )
    inbox_cursor = encode_cursor("approvals", "2026-01-01T00:00:00Z", "ap-1")
    for bad in ["not-a-cursor", inbox_cursor, encode_cursor("memory", "0")]:
        resp = await api.client.get("/audit", params={"cursor": bad}, headers=admin)
        problem(resp, 422, "VALIDATION_ERROR")


async def test_a_list_refuses_another_lists_cursor_and_a_made_up_one(api: Api) -> None:
    """Before, a runs cursor paged the inbox (and the other way round), and a cursor
    with no time in it read as one."""
    for _ in range(3):
        await api.create()
    resp = await api.client.get("/runs?limit=1")
    runs_cursor = resp.json()["next_cursor"]
    assert (await api.client.get("/runs", params={"cursor": runs_cursor})).status_code == 200
    at = "2026-01-01T00:00:00Z"
    for path, others in {
        "/runs": [encode_cursor("approvals", at, "ap-1"), encode_cursor("audit", at, "au-1")],
        "/approvals": [runs_cursor, encode_cursor("audit", at, "au-1")],
    }.items():
        forged = encode_cursor(path.strip("/"), "notadate", "x")
        untagged = encode_cursor(at, "x")
        for bad in [*others, forged, untagged]:
            resp = await api.client.get(path, params={"cursor": bad})
            problem(resp, 422, "VALIDATION_ERROR")
