"""A real server SIGKILLs itself at each point around a tool call; the restart counts effects.

Points (runtime/failpoints.py): before the handler, during it (the outbox row is
committed), after it (outcome not yet in the ledger), and between the ledger
write and the checkpoint write.
"""

from __future__ import annotations

import pytest

from tests.agents import counter_lines
from tests.auth import MGR
from tests.integration.conftest import state_is
from tests.integration.server_proc import ServerProcess
from tools.retail import outbox_rows

EAST = {"scope": ["sales_region:east"]}


def crash_then_restart(server: ServerProcess) -> None:
    assert server.proc is not None
    assert server.proc.wait(60) == -9, "the failpoint should have killed the server"
    server.env.pop("AGENT_RUNTIME_FAILPOINTS")
    server.start()


@pytest.mark.parametrize("point", ["tool.before", "tool.during", "tool.after", "ledger.after"])
def test_publish_happens_once_whatever_the_crash_point(
    pg_server: ServerProcess, point: str
) -> None:
    server = pg_server
    server.env["AGENT_RUNTIME_FAILPOINTS"] = f"{point}:publish_report"
    server.start()
    with server.client() as http:
        run_id = http.post("/runs", json={"input": "east drop?", "context": EAST}).json()["run_id"]
        server.follow(run_id, state_is("waiting_human"))
        approval_id = http.get(f"/runs/{run_id}").json()["pending_approval"]["approval_id"]
        http.post(
            f"/runs/{run_id}/approvals/{approval_id}", json={"decision": "approve"}, headers=MGR
        )
    crash_then_restart(server)
    with server.client() as http:
        server.follow(run_id, state_is("succeeded", "failed"))
        run = http.get(f"/runs/{run_id}").json()
        calls = http.get(f"/runs/{run_id}/tool-calls").json()
    assert run["state"] == "succeeded", run
    publish = next(c for c in calls if c["tool"] == "publish_report")
    assert publish["status"] == "succeeded"
    rows = outbox_rows(server.data_dir / "retail.db")
    assert len(rows) == 1 and rows[0]["idempotency_key"] == publish["idempotency_key"]
    # Re-run (before: nothing had happened), reconciled with the outbox (during,
    # after) or replayed from the ledger (ledger.after): the handler ran at most twice
    # and queued once.
    assert publish["attempts"] == (2 if point == "tool.before" else 1)


@pytest.mark.parametrize(
    ("point", "decision"), [("tool.before", "approve"), ("tool.after", "reject")]
)
def test_unknown_outcome_of_a_non_idempotent_call_goes_to_a_human(
    pg_server: ServerProcess, point: str, decision: str
) -> None:
    server = pg_server
    server.env["AGENT_RUNTIME_FAILPOINTS"] = f"{point}:counter"
    server.start()
    with server.client() as http:
        run_id = http.post("/runs", json={"agent_id": "slow_worker", "input": "sleep 0"}).json()[
            "run_id"
        ]
    crash_then_restart(server)
    with server.client() as http:
        server.follow(run_id, state_is("waiting_human"))
        run = http.get(f"/runs/{run_id}").json()
        pending = run["pending_approval"]
        assert "unknown" in pending["reason"] and pending["tool"] == "counter"
        calls = http.get(f"/runs/{run_id}/tool-calls").json()
        assert [c["status"] for c in calls] == ["unknown"]
        # The human looked: "before" never ran (run it), "after" did (do not).
        http.post(
            f"/runs/{run_id}/approvals/{pending['approval_id']}",
            json={"decision": decision},
            headers=MGR,
        )
        server.follow(run_id, state_is("succeeded", "failed"))
        final = http.get(f"/runs/{run_id}").json()
        events = http.get(f"/runs/{run_id}/events", headers={"Accept": "application/json"})
    assert final["state"] == "succeeded", final
    assert len(counter_lines(server.data_dir)) == 1
    # The log pairs each run of the call with its result: run again, a second action.
    counted = [
        (e["type"], e["data"].get("status"), e["data"].get("rerun"))
        for e in events.json()
        if e["type"] in ("action", "result") and e["data"]["tool"] == "counter"
    ]
    ran_again = [("action", None, True), ("result", "succeeded", None)]
    assert counted == [
        ("action", None, None),
        ("result", "unknown", None),
        *(ran_again if decision == "approve" else []),
    ]
