"""A run that kills every worker it meets is failed, not handed on for ever, and the
runs that were in flight beside it are not failed with it.

The sleep tool (idempotent: a takeover runs it again) SIGKILLs its process each time it
is about to run; every restart takes the run over from its checkpoint and meets it
again. At the third takeover in a row with no step checkpointed in between the run is
a suspect, driven by a worker with nothing else to drive; killing that one too, it
fails with RUN_CRASH_LOOP instead of being driven once more.
"""

from __future__ import annotations

from pathlib import Path

from tests.agents import counter_lines
from tests.auth import MGR
from tests.integration.conftest import state_is
from tests.integration.server_proc import ServerProcess
from tools.retail import outbox_rows

JSON = {"Accept": "application/json"}


def test_a_run_that_kills_each_worker_fails_once_it_killed_one_alone(
    server: ServerProcess,
) -> None:
    server.env["AGENT_RUNTIME_FAILPOINTS"] = "tool.before:sleep"
    server.start()
    with server.client() as http:
        created = http.post("/runs", json={"agent_id": "slow_worker", "input": "sleep 0.05"})
        run_id = created.json()["run_id"]
    # The first worker, two that took the run over from it, and one that drove it alone,
    # each killed by the call.
    for lost in range(4):
        assert server.proc is not None
        assert server.proc.wait(60) == -9, f"worker {lost + 1} should have been killed"
        server.start(wait=lost == 3)  # the restarts before it die as they start

    with server.client() as http:
        server.follow(run_id, state_is("succeeded", "failed"))
        run = http.get(f"/runs/{run_id}").json()
        calls = http.get(f"/runs/{run_id}/tool-calls").json()
        events = http.get(f"/runs/{run_id}/events", headers=JSON).json()
    assert server.alive, "the fifth worker does not drive the run: it lives"
    assert run["state"] == "failed", run
    assert run["outcome"]["code"] == "RUN_CRASH_LOOP"
    counter, sleep = calls
    # Each killed worker had counted an attempt of the sleep; none is made after them.
    assert (counter["tool"], counter["status"]) == ("counter", "succeeded")
    assert (sleep["tool"], sleep["attempts"]) == ("sleep", 4)
    assert sleep["status"] == "unknown" and sleep["error"]["code"] == "RUN_CRASH_LOOP"
    assert len(counter_lines(server.data_dir)) == 1

    errors = [e["data"] for e in events if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["WORKER_LOST"] * 4 + ["RUN_CRASH_LOOP"]
    final = errors[-1]
    assert final["tool_call_id"] == sleep["tool_call_id"]
    assert final["recovery"] == "human" and "4 workers in a row" in final["message"]
    assert errors[-2]["worker"] in final["message"]
    results = [(e["data"]["tool"], e["data"]["status"]) for e in events if e["type"] == "result"]
    assert results == [("counter", "succeeded"), ("sleep", "unknown")]


def test_a_reconcile_that_kills_the_worker_is_not_asked_again_to_fail_the_run(
    tmp_path: Path, data_dir: Path
) -> None:
    """The publish is cut off mid-call; every takeover asks its reconcile what became of
    it, and the reconcile kills the worker (the suspect's, alone, too). The drive that
    fails the run asks once more, as a cancel would, and dies; the next fails it
    without asking."""
    server = ServerProcess(data_dir, f"sqlite:///{tmp_path / 'runtime.db'}")
    try:
        server.env["AGENT_RUNTIME_FAILPOINTS"] = "tool.during:publish_report,reconcile"
        server.start()
        with server.client() as http:
            run_id = http.post(
                "/runs", json={"input": "east drop?", "context": {"scope": ["sales_region:east"]}}
            ).json()["run_id"]
            server.follow(run_id, state_is("waiting_human"))
            approval_id = http.get(f"/runs/{run_id}").json()["pending_approval"]["approval_id"]
            http.post(
                f"/runs/{run_id}/approvals/{approval_id}", json={"decision": "approve"}, headers=MGR
            )
        # Killed publishing, then by the reconcile in four takeovers (the fourth's
        # failing of the run included).
        for lost in range(5):
            assert server.proc is not None
            assert server.proc.wait(60) == -9, f"worker {lost + 1} should have been killed"
            server.start(wait=lost == 4)

        with server.client() as http:
            server.follow(run_id, state_is("succeeded", "failed"))
            run = http.get(f"/runs/{run_id}").json()
            calls = {c["tool"]: c for c in http.get(f"/runs/{run_id}/tool-calls").json()}
        assert server.alive
    finally:
        server.stop()
    assert run["state"] == "failed" and run["outcome"]["code"] == "RUN_CRASH_LOOP", run
    assert "5 workers in a row" in run["outcome"]["message"]
    assert "not asked" in run["outcome"]["message"]
    publish = calls["publish_report"]
    assert publish["status"] == "unknown" and publish["attempts"] == 1
    # It did take effect, once: nobody could say so, so the outcome lists it as an
    # effect that may have happened.
    assert len(outbox_rows(data_dir / "retail.db")) == 1
    assert publish["tool_call_id"] in run["outcome"]["side_effects"]


def test_the_runs_beside_a_killer_are_not_failed_with_it(tmp_path: Path, data_dir: Path) -> None:
    """One embedded process drives both: each death takes over both, the run thinking
    for seconds and the one that kills. Each becomes a suspect; driven alone, the first
    moves on and succeeds, the second kills its worker alone and fails."""
    server = ServerProcess(data_dir, f"sqlite:///{tmp_path / 'runtime.db'}")
    try:
        server.env["AGENT_RUNTIME_FAILPOINTS"] = "tool.before:sleep"
        server.start()
        with server.client() as http:
            thinker = http.post("/runs", json={"agent_id": "swallower", "input": "think 5"})
            server.follow(thinker.json()["run_id"], state_is("planning"))
            killer = http.post("/runs", json={"agent_id": "slow_worker", "input": "sleep 0.05"})
        for lost in range(4):
            assert server.proc is not None
            assert server.proc.wait(60) == -9, f"worker {lost + 1} should have been killed"
            server.start(wait=lost == 3)
        with server.client() as http:
            ended = {}
            for created in (thinker, killer):
                run_id = created.json()["run_id"]
                server.follow(run_id, state_is("succeeded", "failed"))
                ended[created.json()["agent_id"]] = http.get(f"/runs/{run_id}").json()
        assert server.alive
    finally:
        server.stop()
    assert ended["swallower"]["state"] == "succeeded", ended["swallower"]
    assert ended["slow_worker"]["state"] == "failed"
    assert ended["slow_worker"]["outcome"]["code"] == "RUN_CRASH_LOOP"
    # The thinker's count (its one side effect, after the thinking) and the killer's.
    assert len(counter_lines(data_dir)) == 2
