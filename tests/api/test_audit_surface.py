"""The read side: agents, trace, checkpoint, steps, health, OpenAPI."""

from __future__ import annotations

import asyncio

import pytest

from server.api.routes import system
from tests.api.conftest import Api
from tests.api.helpers import problem


async def test_agents_health_and_openapi(api: Api) -> None:
    agents = {a["agent_id"]: a for a in (await api.client.get("/agents")).json()}
    retail = agents["retail_analyst"]
    assert retail["default"] is True
    tools = {t["name"]: t for t in retail["tools"]}
    assert tools["publish_report"]["risk"] == "high"
    assert tools["publish_report"]["reconcile"] and tools["publish_report"]["compensate"]
    assert "properties" in tools["query_sales"]["schema"]
    assert (await api.client.get("/healthz")).json() == {"status": "ok"}
    assert (await api.client.get("/readyz")).json() == {"status": "ready"}
    spec = (await api.client.get("/openapi.json")).json()
    for path in (
        "/runs",
        "/runs/{run_id}",
        "/runs/{run_id}/events",
        "/runs/{run_id}/trace",
        "/runs/{run_id}/checkpoint",
        "/approvals",
        "/runs/{run_id}/approvals/{approval_id}",
        "/runs/{run_id}/cancel",
        "/artifacts/{artifact_id}",
        "/agents",
    ):
        assert path in spec["paths"], path
    assert "201" in spec["paths"]["/runs"]["post"]["responses"]
    assert "422" in spec["paths"]["/runs"]["post"]["responses"]


async def test_trace_and_checkpoint_explain_a_parked_run(api: Api) -> None:
    run = await api.create()
    parked = await api.settle(run["run_id"])
    run_id = parked["run_id"]
    checkpoint = (await api.client.get(f"/runs/{run_id}/checkpoint")).json()
    assert set(checkpoint) >= {
        "run_id",
        "state",
        "step_index",
        "planner_context_ref",
        "tool_calls",
        "memory_snapshot",
        "handoff_stack",
        "pending_approval",
        "budget",
    }
    assert checkpoint["state"] == "waiting_human" and checkpoint["next"] == ["approval"]
    assert (
        checkpoint["pending_approval"]["approval_id"] == parked["pending_approval"]["approval_id"]
    )
    assert len(checkpoint["tool_calls"]) == 2 and checkpoint["budget"]["tool_calls"] == 2
    trace = (await api.client.get(f"/runs/{run_id}/trace")).json()
    # Parked inside the sub-agent the analyst handed the report to.
    assert [f["agent_id"] for f in checkpoint["handoff_stack"]] == ["report_writer"]
    assert [s["step_index"] for s in trace["steps"]] == [0, 1, 2, 3]
    assert all(s["decision"]["summary"] for s in trace["steps"])
    assert [(s["decision"]["agent_id"], s["decision"]["kind"]) for s in trace["steps"]] == [
        ("retail_analyst", "tool_calls"),
        ("retail_analyst", "handoff"),
        ("report_writer", "tool_calls"),
        ("report_writer", "tool_calls"),
    ]
    assert [t["tool"] for t in trace["tool_calls"]] == ["query_sales", "write_report"]
    assert trace["approvals"][0]["status"] == "pending"
    assert trace["approvals"][0]["args_hash"]
    assert [e["seq"] for e in trace["events"]] == list(range(1, len(trace["events"]) + 1))
    inbox = (await api.client.get("/approvals")).json()
    assert [a["run_id"] for a in inbox] == [run_id]


async def test_large_tool_output_is_an_artifact_not_a_checkpoint_blob(api: Api) -> None:
    run = await api.create()
    parked = await api.settle(run["run_id"])
    calls = (await api.client.get(f"/runs/{parked['run_id']}/tool-calls")).json()
    report = next(c for c in calls if c["tool"] == "write_report")
    assert report["artifact_id"].startswith("sha256:")
    body = await api.client.get(f"/artifacts/{report['artifact_id']}")
    assert body.headers["x-content-type-options"] == "nosniff"
    import hashlib

    assert "sha256:" + hashlib.sha256(body.content).hexdigest() == report["artifact_id"]

    # Its name is its content: a client holding it is told so, and sent nothing again.
    etag = body.headers["etag"]
    assert etag == f'"{report["artifact_id"]}"'
    for held in ([etag], [f"W/{etag}"], [f'"sha256:other", {etag}'], ["*"], ['"x"', etag]):
        again = await api.client.get(
            f"/artifacts/{report['artifact_id']}",
            headers=[("If-None-Match", line) for line in held],
        )
        assert again.status_code == 304 and again.content == b"", held
        assert again.headers["etag"] == etag and "immutable" in again.headers["cache-control"]
    other = await api.client.get(
        f"/artifacts/{report['artifact_id']}", headers={"If-None-Match": '"sha256:other"'}
    )
    assert other.status_code == 200 and other.content == body.content
    gone = await api.client.get("/artifacts/sha256:" + "0" * 64, headers={"If-None-Match": "*"})
    assert gone.status_code == 404  # "*" matches a representation that exists, only


async def test_every_step_names_the_agent_that_decided_it(api: Api) -> None:
    """The test agents' graphs are built without an agent_id: the run's agent decided."""
    run = await api.create(agent_id="typo_fixer", input="x")
    await api.settle(run["run_id"])

    steps = (await api.client.get(f"/runs/{run['run_id']}/steps")).json()

    assert len(steps) >= 2
    assert {s["decision"]["agent_id"] for s in steps} == {"typo_fixer"}


async def test_readiness_is_answered_within_its_bound_when_the_database_hangs(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database that takes no new connection held /readyz for the pool's 30 s wait,
    past any prober's timeout; it says not ready within its own bound."""
    monkeypatch.setattr(system, "READY_WITHIN_S", 0.2)
    hung = asyncio.Event()

    async def hang() -> None:
        await hung.wait()

    monkeypatch.setattr(api.engine_services.store, "ping", hang)
    resp = await api.client.get("/readyz", timeout=10)

    problem(resp, 503, "UNAVAILABLE")
    assert resp.headers["Retry-After"] == "1"
    assert resp.json()["detail"] == "the database did not answer within 0.2 s"

    async def refuse() -> None:
        raise ConnectionRefusedError("no one at 5432")

    monkeypatch.setattr(api.engine_services.store, "ping", refuse)
    resp = await api.client.get("/readyz", timeout=10)
    problem(resp, 503, "UNAVAILABLE")
    assert resp.json()["detail"] == "the database is unavailable"  # not the driver's text
