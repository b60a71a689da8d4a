"""Secret tool args never show: not in events, approvals, steps, tool calls, traces, the
checkpoint view or logs, while the tool itself gets the real value and runs once."""

from __future__ import annotations

import json
import logging

import pytest

from server.logs import quiet_sql_parameters
from tests.api.conftest import Api
from tests.auth import MGR
from tests.security_agents import SECRET


async def test_secret_args_are_redacted_everywhere(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    quiet_sql_parameters()  # as the server's own logging setup does
    run = await api.create(agent_id="rotator", input="rotate", context={})
    run_id = run["run_id"]
    await api.wait_event(run_id, lambda e: e["data"].get("to") == "waiting_human")
    pending = (await api.client.get(f"/runs/{run_id}")).json()["pending_approval"]
    inbox = (await api.client.get("/approvals")).json()
    assert inbox[0]["args"] == {"account": "svc-reporting", "password": "[redacted]"}
    resp = await api.client.post(
        f"/runs/{run_id}/approvals/{pending['approval_id']}",
        json={"decision": "approve"},
        headers=MGR,
    )
    assert resp.status_code == 202
    assert (await api.settle(run_id))["state"] == "succeeded"

    # The tool got the real value, once.
    rotated = (api.settings.data_dir / "rotated.log").read_text().splitlines()
    assert rotated == [f"svc-reporting {SECRET}"]

    shown = []
    for path in ("", "/trace", "/steps", "/tool-calls", "/checkpoint", "/events"):
        resp = await api.client.get(f"/runs/{run_id}{path}", headers={"Accept": "application/json"})
        assert resp.status_code == 200
        shown.append(resp.text)
    shown.append((await api.client.get("/approvals", params={"state": "approved"})).text)
    for text in shown:
        assert SECRET not in text
    trace = json.loads(shown[1])
    assert trace["tool_calls"][0]["args"]["password"] == "[redacted]"
    assert trace["steps"][0]["decision"]["tool_calls"][0]["args"]["password"] == "[redacted]"
    assert all(SECRET not in record.getMessage() for record in caplog.records)


async def test_args_of_an_unknown_tool_show_no_values(api: Api) -> None:
    """What an unknown tool declared secret is unknowable: its call shows keys only."""
    run = await api.create(agent_id="wanderer", input="go", context={})
    assert (await api.settle(run["run_id"]))["state"] == "succeeded"
    steps = (await api.client.get(f"/runs/{run['run_id']}/steps")).json()
    assert steps[0]["decision"]["tool_calls"][0] == {
        "tool": "teleport",
        "version": None,
        "args": {"where": "[redacted]"},
    }


async def test_a_secret_quoted_in_a_tool_error_is_scrubbed(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler's error text is its own; the runtime scrubs the secret args' values
    out of it before the ledger, the events, the run's outcome, the planner or the log."""
    caplog.set_level(logging.DEBUG)
    quiet_sql_parameters()
    run = await api.create(agent_id="leaker", input="check", context={})
    final = await api.settle(run["run_id"])
    assert final["state"] == "failed" and final["outcome"]["code"] == "TOOL_FAILED"
    assert "upstream rejected key '[redacted]'" in final["outcome"]["message"]
    for path in ("", "/trace", "/tool-calls", "/checkpoint", "/events"):
        resp = await api.client.get(
            f"/runs/{run['run_id']}{path}", headers={"Accept": "application/json"}
        )
        assert resp.status_code == 200 and SECRET not in resp.text, path
    logged = "\n".join(api_log_text(record) for record in caplog.records)
    assert "check_key@1 failed" in logged and SECRET not in logged


def api_log_text(record: logging.LogRecord) -> str:
    """The record as a handler would print it, traceback included."""
    return logging.Formatter().format(record)
