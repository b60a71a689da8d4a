"""A tool's output is any JSON value, not only an object: each is kept as it was given."""

from __future__ import annotations

from runtime.events import summarize
from tests.agents import SAID
from tests.api.conftest import Api


async def test_a_tool_may_return_a_bare_json_value(api: Api) -> None:
    """A bare string was stored as is and read back as JSON: every read of the run
    failed (its drive retried for ever, its tool calls and trace were 500s), and "42"
    would have come back a number."""
    run = await api.create(agent_id="plain_talker", input="x")
    done = await api.settle(run["run_id"])
    assert done["state"] == "succeeded", done
    expected = [[*v] if isinstance(v, tuple) else v for v in SAID.values()]
    calls = (await api.client.get(f"/runs/{run['run_id']}/tool-calls")).json()
    assert [c["output"] for c in calls] == expected
    events = await api.events(run["run_id"])
    results = [e["data"]["output"] for e in events if e["type"] == "result"]
    assert results == [summarize(v) for v in expected]  # an event carries a summary
    trace = await api.client.get(f"/runs/{run['run_id']}/trace")
    assert trace.status_code == 200
    assert [c["output"] for c in trace.json()["tool_calls"]] == expected
    assert done["result"]["answer"] == repr(expected)  # what the planner saw, in order


async def test_a_bare_string_an_earlier_version_stored_as_is_reads_back(api: Api) -> None:
    run = await api.create(agent_id="plain_talker", input="x")
    await api.settle(run["run_id"])
    async with api.engine_services.store.tx() as tx:  # as versions before the fix wrote it
        await tx.execute(
            "UPDATE tool_calls SET output = ? WHERE run_id = ? AND output = ?",
            ("plain string", run["run_id"], '"plain string"'),
        )
    calls = (await api.client.get(f"/runs/{run['run_id']}/tool-calls")).json()
    assert calls[0]["output"] == "plain string"
    assert (await api.client.get(f"/runs/{run['run_id']}/trace")).status_code == 200
