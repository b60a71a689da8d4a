"""Text in the SQLite file that is not UTF-8 (a hand edit, another program: PostgreSQL
refuses such text on the way in). sqlite3 raised at the row that held it, so every page,
trace and stream of the run that reached it was a 500, and a stream's reconnects met it
again each time: the row shows in its unreadable form instead, as one that no longer
validates does."""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import Api
from tests.api.helpers import corrupt, parked_demo_run, unreadable
from tests.api.test_unreadable_events import MARKED, stream

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

BAD_DATA = b'{"to": "\xff"}'
"""JSON but for one byte that is no UTF-8: what replacing it made would parse."""
BAD_TYPE = b"st\xffte"


async def undecodable(api: Api, run_id: str, data_seq: int, type_seq: int) -> None:
    where = "run_id = ? AND seq = ?"
    await corrupt(api, "events", "data = CAST(? AS TEXT)", where, BAD_DATA, run_id, data_seq)
    await corrupt(api, "events", "type = CAST(? AS TEXT)", where, BAD_TYPE, run_id, type_seq)


async def test_pages_and_the_trace_show_undecodable_events_marked(api: Api) -> None:
    run_id, _, _ = await parked_demo_run(api)
    before = await api.events(run_id)
    bad_data, bad_type = before[2]["seq"], before[4]["seq"]
    await undecodable(api, run_id, bad_data, bad_type)

    after = await api.events(run_id)

    assert [e["seq"] for e in after] == [e["seq"] for e in before]
    marked = unreadable(after)
    assert [e["seq"] for e in marked] == [bad_data, bad_type]
    assert all(set(e) == MARKED for e in marked)
    assert marked[0]["type"] == before[2]["type"]
    assert marked[1]["type"] == "st\ufffdte"  # as stored, its bad byte shown as such
    assert [e for e in after if not e.get("unreadable")] == [
        e for e in before if e["seq"] not in (bad_data, bad_type)
    ]
    trace = await api.client.get(f"/runs/{run_id}/trace")
    assert trace.status_code == 200
    assert json.loads(trace.content)["events"] == after


async def test_a_stream_sends_undecodable_events_marked_and_ends_with_the_run(api: Api) -> None:
    run = await api.create(agent_id="typo_fixer", input="echo")
    run_id = run["run_id"]
    ended = await api.client.get(f"/runs/{run_id}", headers={"Prefer": "wait=30"})
    assert ended.json()["state"] == "succeeded"
    before = await api.events(run_id)
    bad_data, bad_type = before[1]["seq"], before[-2]["seq"]
    await undecodable(api, run_id, bad_data, bad_type)

    everything = await stream(api, run_id)

    assert [seq for seq, _, _ in everything] == [e["seq"] for e in before]
    marked = [(seq, name) for seq, name, data in everything if data.get("unreadable")]
    assert marked == [(bad_data, "unreadable"), (bad_type, "unreadable")]
    resumed = await stream(api, run_id, **{"Last-Event-ID": str(bad_data)})
    assert [seq for seq, _, _ in resumed] == [e["seq"] for e in before if e["seq"] > bad_data]


async def test_a_run_row_with_undecodable_text_reads_as_it_did(api: Api) -> None:
    """Outside the JSON columns the text is kept as read, its bad bytes shown as such."""
    run = await api.create(agent_id="typo_fixer", input="echo")
    run_id = run["run_id"]
    await api.client.get(f"/runs/{run_id}", headers={"Prefer": "wait=30"})
    await corrupt(api, "runs", "input = CAST(? AS TEXT)", "run_id = ?", b"ech\xff", run_id)

    resp = await api.client.get(f"/runs/{run_id}")

    assert resp.status_code == 200, resp.text
    assert resp.json()["input"] == "ech\ufffd"
