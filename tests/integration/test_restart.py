"""Checks 3 and 6 of chapter 22.6 with a real server process killed by SIGKILL."""

from __future__ import annotations

import time

from tests.agents import counter_lines, transfer_lines
from tests.auth import MGR
from tests.integration.conftest import state_is
from tests.integration.server_proc import ServerProcess, wait_for_file

EAST = {"scope": ["sales_region:east"]}


def test_waiting_human_survives_sigkill_and_resumes_on_approval(server: ServerProcess) -> None:
    server.start()
    with server.client() as http:
        run = http.post(
            "/runs", json={"input": "上周华东区销售下滑的主要 SKU 是什么？", "context": EAST}
        ).json()
        run_id = run["run_id"]
        server.follow(run_id, state_is("waiting_human"))
        approval_id = http.get(f"/runs/{run_id}").json()["pending_approval"]["approval_id"]
    server.kill()

    server.start()
    with server.client() as http:
        after = http.get(f"/runs/{run_id}").json()
        assert after["state"] == "waiting_human"
        assert after["pending_approval"]["approval_id"] == approval_id
        inbox = http.get("/approvals", params={"state": "pending"}).json()
        assert [a["approval_id"] for a in inbox] == [approval_id]
        # The approval waits inside report_writer, the sub-agent the analyst handed off to.
        stack = http.get(f"/runs/{run_id}/checkpoint").json()["handoff_stack"]
        assert [f["agent_id"] for f in stack] == ["report_writer"]
        last_seq = http.get(
            f"/runs/{run_id}/events", headers={"Accept": "application/json"}
        ).json()[-1]["seq"]
        resp = http.post(
            f"/runs/{run_id}/approvals/{approval_id}",
            json={"decision": "approve"},
            headers=MGR,
        )
        assert resp.status_code == 202, resp.text
        tail = server.follow(run_id, state_is("succeeded", "failed"), after=last_seq)
        assert tail[0]["type"] == "approval_result"
        final = http.get(f"/runs/{run_id}").json()
        assert final["run_id"] == run_id and final["state"] == "succeeded", final
        publishes = [
            t
            for t in http.get(f"/runs/{run_id}/tool-calls").json()
            if t["tool"] == "publish_report"
        ]
        assert len(publishes) == 1 and publishes[0]["status"] == "succeeded"
    from tools.retail import count_outbox

    assert count_outbox(server.data_dir / "retail.db") == 1


def test_sigkill_while_executing_resumes_without_repeating_finished_calls(
    server: ServerProcess,
) -> None:
    server.start()
    with server.client() as http:
        run_id = http.post("/runs", json={"agent_id": "slow_worker", "input": "sleep 30"}).json()[
            "run_id"
        ]
        server.follow(run_id, lambda e: e["type"] == "action" and e["data"]["tool"] == "sleep")
    # The action event is written just before the handler starts; its log line proves it did.
    wait_for_file(server.data_dir / "sleep.log")
    assert counter_lines(server.data_dir) and len(counter_lines(server.data_dir)) == 1
    # Long enough in the sleep for lease renewals (every 2/3 s) to record the time spent.
    time.sleep(2.5)
    server.kill()

    # Shorten the resumed sleep: same run, same checkpoint; the sleep tool is idempotent.
    server.env["TEST_SLEEP_OVERRIDE"] = "0.05"
    server.start()
    with server.client() as http:
        server.follow(run_id, state_is("succeeded", "failed"))
        final = http.get(f"/runs/{run_id}").json()
        assert final["state"] == "succeeded", final
        calls = http.get(f"/runs/{run_id}/tool-calls").json()
        events = http.get(f"/runs/{run_id}/events", headers={"Accept": "application/json"})
    assert [c["tool"] for c in calls] == ["counter", "sleep"]
    # The record says where the killed process's drive ended and the next one began.
    [lost] = [e["data"] for e in events.json() if e["type"] == "error"]
    assert lost["code"] == "WORKER_LOST" and lost["recovery"] == "resume"
    assert calls[1]["attempts"] == 2, calls[1]
    # Both runs of the sleep are on the log, the second after the loss that explains it.
    kinds = [(e["type"], e["data"].get("tool_call_id")) for e in events.json()]
    sleep_id = calls[1]["tool_call_id"]
    assert [k for k in kinds if k[1] == sleep_id or k[0] == "error"] == [
        ("action", sleep_id),
        ("error", None),
        ("action", sleep_id),
        ("result", sleep_id),
    ], kinds
    # The 2.5 s the killed drive spent in the sleep are in no checkpoint; they are
    # still the run's (a crash must not hand a run its time back).
    assert final["usage"]["active_s"] >= 1.5, final["usage"]
    assert len(counter_lines(server.data_dir)) == 1
    sleeps = (server.data_dir / "sleep.log").read_text().splitlines()
    assert len(sleeps) == 2 and sleeps[0] == sleeps[1]


def test_a_reconcile_that_hangs_after_a_sigkill_is_asked_again_by_a_retried_drive(
    server: ServerProcess,
) -> None:
    """The remote system does not answer the first time it is asked about the transfer
    the killed process left running: that drive fails within the tool's timeout and
    the next one asks again (not the run's time budget running out, nor a hang)."""
    server.start()
    with server.client() as http:
        run_id = http.post("/runs", json={"agent_id": "transferrer", "input": "last 3"}).json()[
            "run_id"
        ]
        server.follow(run_id, lambda e: e["type"] == "action" and e["data"]["tool"] == "transfer")
    time.sleep(0.5)  # in the transfer, whose effect lands as it ends
    server.kill()
    assert transfer_lines(server.data_dir) == []

    server.env["TEST_RECONCILE_HANGS_ONCE"] = "1"
    server.env["TEST_TRANSFER_TIMEOUT_S"] = "5"
    server.start()
    with server.client() as http:
        server.follow(run_id, state_is("succeeded", "failed"))
        final = http.get(f"/runs/{run_id}").json()
        [call] = http.get(f"/runs/{run_id}/tool-calls").json()
    assert (server.data_dir / "reconcile.hung").exists()  # the first ask hung
    assert final["state"] == "succeeded", final["outcome"]
    # Asked again, it said the transfer never landed: run once more, landed once.
    assert [line.split()[1] for line in transfer_lines(server.data_dir)] == ["5"]
    assert call["status"] == "succeeded" and call["attempts"] == 2, call
