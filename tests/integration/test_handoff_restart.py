"""A handoff run killed (SIGKILL) while its sub-agent works continues in the sub-agent."""

from __future__ import annotations

from tests.agents import counter_lines
from tests.integration.conftest import state_is
from tests.integration.server_proc import ServerProcess, wait_for_file


def test_handoff_killed_mid_sub_agent_resumes_in_the_sub_agent(server: ServerProcess) -> None:
    server.start()
    with server.client() as http:
        run_id = http.post(
            "/runs", json={"agent_id": "delegator", "input": "slow_worker sleep 30"}
        ).json()["run_id"]
        server.follow(run_id, lambda e: e["type"] == "action" and e["data"]["tool"] == "sleep")
    # The action event is written just before the handler starts; its log line proves it did.
    wait_for_file(server.data_dir / "sleep.log")
    server.kill()

    # Restarted without a worker, nothing drives the run: this is what the crash left.
    server.no_worker = True
    server.start()
    with server.client() as http:
        cp = http.get(f"/runs/{run_id}/checkpoint").json()
        left = {c["tool"]: c for c in http.get(f"/runs/{run_id}/tool-calls").json()}
    server.stop()
    assert cp["state"] == "executing" and cp["next"] == ["executor"], cp
    [frame] = cp["handoff_stack"]
    assert (frame["agent_id"], frame["from_agent"], frame["task"]) == (
        "slow_worker",
        "delegator",
        "sleep 30",
    )
    assert left["echo"]["status"] == "succeeded" and left["counter"]["status"] == "succeeded"
    assert left["sleep"]["status"] == "running"

    # Shorten the resumed sleep: same run, same checkpoint; the sleep tool is idempotent.
    server.no_worker = False
    server.env["TEST_SLEEP_OVERRIDE"] = "0.05"
    server.start()
    with server.client() as http:
        server.follow(run_id, state_is("succeeded", "failed"))
        final = http.get(f"/runs/{run_id}").json()
        trace = http.get(f"/runs/{run_id}/trace").json()
        after = http.get(f"/runs/{run_id}/checkpoint").json()
    assert final["state"] == "succeeded", final
    assert final["result"]["answer"] == "slow_worker said slept"
    calls = trace["tool_calls"]
    assert [(c["tool"], c["attempts"]) for c in calls] == [
        ("echo", 1),
        ("counter", 1),
        ("sleep", 2),
    ]
    assert {c["tool"]: c["tool_call_id"] for c in calls} == {
        t: c["tool_call_id"] for t, c in left.items()
    }
    # The non-idempotent counter ran once; the sleep the crash cut short ran again, same id.
    assert len(counter_lines(server.data_dir)) == 1
    sleeps = (server.data_dir / "sleep.log").read_text().splitlines()
    assert len(sleeps) == 2 and sleeps[0] == sleeps[1] == left["sleep"]["tool_call_id"]
    # It went on in the sub-agent: its finish, not the delegator, decided after the sleep.
    assert [(s["decision"]["agent_id"], s["decision"]["kind"]) for s in trace["steps"]] == [
        ("delegator", "tool_calls"),
        ("delegator", "handoff"),
        ("slow_worker", "tool_calls"),
        ("slow_worker", "tool_calls"),
        ("slow_worker", "finish"),
        ("delegator", "finish"),
    ]
    moves = [
        (e["data"]["handoff"]["phase"], e["data"]["tool_call_id"])
        for e in trace["events"]
        if "handoff" in e["data"]
    ]
    assert moves == [("start", frame["handoff_id"]), ("return", frame["handoff_id"])]
    assert after["handoff_stack"] == []
