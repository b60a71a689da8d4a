"""SIGTERM: stop claiming, hand the runs back from their checkpoints, exit cleanly."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path
from typing import TypedDict

import httpx
import pytest

from tests.agents import counter_lines
from tests.auth import OPS
from tests.integration.conftest import Processes, state_is
from tests.integration.scale_out import create_run
from tests.integration.server_proc import ServerProcess, WorkerProcess, wait_for_file


class LongLeaseEnv(TypedDict):
    """Extra environment for a server process; typed, so ``**`` can only fill ``**env``."""

    AGENT_RUNTIME_LEASE_SECONDS: str
    AGENT_RUNTIME_SHUTDOWN_GRACE_S: str


# Leases far longer than the test: a run can only move on if it was handed back.
LONG_LEASE: LongLeaseEnv = {
    "AGENT_RUNTIME_LEASE_SECONDS": "600",
    "AGENT_RUNTIME_SHUTDOWN_GRACE_S": "0.5",
}


def test_sigterm_hands_running_runs_to_the_next_process(pg_schema_url: str, data_dir: Path) -> None:
    first = ServerProcess(data_dir, pg_schema_url, **LONG_LEASE).start()
    second = ServerProcess(data_dir, pg_schema_url, TEST_SLEEP_OVERRIDE="0.05", **LONG_LEASE)
    try:
        with first.client() as http:
            run_id = http.post(
                "/runs", json={"agent_id": "slow_worker", "input": "sleep 60"}
            ).json()["run_id"]
        wait_for_file(data_dir / "sleep.log")
        assert first.proc is not None
        first.proc.terminate()
        # uvicorn re-raises the signal once its graceful shutdown is done.
        assert first.proc.wait(30) in (0, -15)
        assert "Traceback" not in first.log_path.read_text()
        second.start()
        with second.client() as http:
            second.follow(run_id, state_is("succeeded", "failed"))
            final = http.get(f"/runs/{run_id}").json()
            calls = http.get(f"/runs/{run_id}/tool-calls").json()
        assert final["state"] == "succeeded", final
        assert [c["tool"] for c in calls] == ["counter", "sleep"]
        assert calls[1]["attempts"] == 2  # cut short by the shutdown, run again (idempotent)
        assert len(counter_lines(data_dir)) == 1
    finally:
        first.stop()
        second.stop()


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("command", "first", "second"),
    [
        ("serve", signal.SIGTERM, signal.SIGTERM),
        ("serve", signal.SIGINT, signal.SIGTERM),
        ("worker", signal.SIGTERM, signal.SIGINT),
    ],
    ids=["serve_term_term", "serve_int_term", "worker_term_int"],
)
def test_a_second_signal_ends_the_grace_and_hands_the_runs_back_at_once(
    pg_schema_url: str,
    data_dir: Path,
    processes: Processes,
    command: str,
    first: signal.Signals,
    second: signal.Signals,
) -> None:
    """An operator who signals again wants the process gone: it waited out the whole
    grace (here longer than the test) whatever came after the first signal."""
    env: LongLeaseEnv = {
        "AGENT_RUNTIME_LEASE_SECONDS": "600",
        "AGENT_RUNTIME_SHUTDOWN_GRACE_S": "600",
    }
    api = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True, **env)).start()
    stopping: ServerProcess | WorkerProcess
    if command == "serve":
        stopping = processes.add(ServerProcess(data_dir, pg_schema_url, **env)).start()
    else:
        stopping = processes.add(WorkerProcess(data_dir, pg_schema_url, **env)).start()
    with api.client() as http:
        run_id = create_run(http, agent_id="slow_worker", input="sleep 100")
    wait_for_file(data_dir / "sleep.log")  # driven by ``stopping``, inside the sleep
    assert stopping.proc is not None
    stopping.proc.send_signal(first)
    time.sleep(2.0)
    assert stopping.proc.poll() is None, "the first signal alone ends the grace"
    stopping.proc.send_signal(second)
    assert stopping.proc.wait(60) in (0, -15)
    assert "Traceback" not in stopping.log_text()
    assert "a second signal: stopping now" in stopping.log_text()
    # Handed back, not left to a lease of ten minutes: the next worker drives it at once.
    processes.add(WorkerProcess(data_dir, pg_schema_url, TEST_SLEEP_OVERRIDE="0.05")).start()
    api.follow(run_id, state_is("succeeded", "failed"))
    with api.client() as http:
        assert http.get(f"/runs/{run_id}").json()["state"] == "succeeded"
        calls = http.get(f"/runs/{run_id}/tool-calls").json()
    assert [c["tool"] for c in calls] == ["counter", "sleep"]
    assert len(counter_lines(data_dir)) == 1


def test_cancel_on_a_server_stops_the_run_in_the_worker_that_holds_it(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    server = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True)).start()
    worker = processes.add(WorkerProcess(data_dir, pg_schema_url, name="holder"))
    worker.start()
    with server.client() as http:
        run_id = http.post("/runs", json={"agent_id": "slow_worker", "input": "sleep 60"}).json()[
            "run_id"
        ]
        wait_for_file(data_dir / "sleep.log")  # the worker is inside the sleep tool
        resp = http.post(f"/runs/{run_id}/cancel", json={"reason": "stop it", "compensate": True})
        assert resp.status_code == 200, resp.text
        run = resp.json()
        calls = {c["tool"]: c for c in http.get(f"/runs/{run_id}/tool-calls").json()}
    assert run["state"] == "failed" and run["outcome"]["code"] == "RUN_CANCELLED"
    assert calls["sleep"]["status"] == "cancelled"  # the in-flight asyncio call was cancelled
    counter_id = calls["counter"]["tool_call_id"]
    assert run["outcome"]["side_effects"] == [counter_id]  # sleep has no side effect
    assert run["outcome"]["compensations"] == [counter_id]
    assert counter_lines(data_dir) == [f"{counter_id} once", f"{counter_id} undo"]


@pytest.mark.parametrize("driven", [True, False], ids=["driven_here", "driven_by_nobody"])
def test_sigterm_answers_a_waiting_request_with_the_run_as_it_is(
    server: ServerProcess, driven: bool
) -> None:
    """Driven here, the wait follows the drive; driven by nobody (an HTTP-only server,
    no worker anywhere), it wakes at each event, the shutdown's included: a cancel that
    came as the event did was lost (Python 3.11's wait_for), and the request hung."""
    server.env["AGENT_RUNTIME_SHUTDOWN_GRACE_S"] = "5"
    server.no_worker = not driven
    server.start()
    with server.client() as http:
        run_id = create_run(http, agent_id="slow_worker", input="sleep 30")
    answers: list[httpx.Response | BaseException] = []

    def wait() -> None:
        try:
            with server.client() as http:
                answers.append(http.get(f"/runs/{run_id}", headers={"Prefer": "wait=60"}))
        except BaseException as exc:  # shown by the assertion below, not lost in the thread
            answers.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    time.sleep(3.0)  # ample for the request to be in and waiting, under a loaded CI
    assert server.proc is not None and not answers, answers
    server.proc.send_signal(signal.SIGTERM)
    waiter.join(30)
    # Not cut off when the grace period (5 s) ends, with a 500: answered as shutdown began.
    (answer,) = answers
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 200, answer.text
    assert answer.headers["preference-applied"] == "wait=60"
    assert answer.json()["state"] in ("pending", "planning", "executing"), answer.json()
    assert server.proc.wait(30) in (0, -15)  # uvicorn re-raises the signal it handled
    assert "Traceback" not in server.log_text()


def test_sigterm_ends_event_streams_at_once(server: ServerProcess) -> None:
    """Before, an open stream held the process for the whole grace period, which then
    cut it off with a traceback; the client reconnects with Last-Event-ID either way."""
    server.env["AGENT_RUNTIME_SHUTDOWN_GRACE_S"] = "20"
    server.start()
    with server.client() as http:
        run_id = create_run(http, agent_id="slow_worker", input="sleep 60")
    ended: list[float | BaseException] = []

    def follow() -> None:
        try:
            with server.client() as http, http.stream("GET", f"/runs/{run_id}/events") as resp:
                for _ in resp.iter_lines():
                    pass
            ended.append(time.monotonic())
        except BaseException as exc:  # shown by the assertion below, not lost in the thread
            ended.append(exc)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    time.sleep(3.0)  # ample for the stream to be open, under a loaded CI
    assert server.proc is not None and not ended, ended
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    follower.join(30)
    (end,) = ended
    assert isinstance(end, float), end  # ended as a stream ends, not cut off
    assert end - sent < 10, "the stream was held for the grace period (20 s)"
    assert server.proc.wait(30) in (0, -15)
    assert "Traceback" not in server.log_text()


def test_ctrl_c_stops_the_server_cleanly(server: ServerProcess) -> None:
    server.start()
    assert server.proc is not None
    server.proc.send_signal(signal.SIGINT)
    # uvicorn re-raises the SIGINT it handled once it has shut down; serve takes it as
    # the end it is, not as an error with a traceback.
    assert server.proc.wait(30) == 0
    assert "Traceback" not in server.log_text()


@pytest.mark.parametrize(
    "setting",
    [
        ("AGENT_RUNTIME_DEFAULT_AGENT", "nobody"),  # fails once the database is open
        ("AGENT_RUNTIME_EXTRA_AGENTS", '["no_such_module:agents"]'),
        ("AGENT_RUNTIME_LEASE_SECONDS", "0"),
    ],
    ids=["default_agent", "extra_agents", "lease_seconds"],
)
def test_a_server_that_cannot_start_exits(server: ServerProcess, setting: tuple[str, str]) -> None:
    """Rather than stay alive serving nothing (the embedded store's threads kept it
    up), which a supervisor takes for a server that is fine."""
    name, value = setting
    server.env[name] = value
    server.start(wait=False)
    assert server.proc is not None
    assert server.proc.wait(30) != 0
    assert name.removeprefix("AGENT_RUNTIME_").lower() in server.log_text().lower()


def test_a_server_whose_embedded_database_is_corrupt_exits(tmp_path: Path, data_dir: Path) -> None:
    """The store fails as it opens, before anything else would close it."""
    db = tmp_path / "runtime.db"
    db.write_bytes(bytes(range(256)) * 32)  # no SQLite file
    server = ServerProcess(data_dir, f"sqlite:///{db}")
    try:
        server.start(wait=False)
        assert server.proc is not None
        assert server.proc.wait(30) != 0
        assert "not a database" in server.log_text()
    finally:
        server.stop()


@pytest.mark.postgres
def test_a_server_stops_claiming_as_its_shutdown_begins_not_once_requests_have_drained(
    pg_schema_url: str, data_dir: Path
) -> None:
    """The worker's stop came after uvicorn's: one slow request held the HTTP side for
    its whole grace, and meanwhile the worker went on claiming runs, then had a grace
    of its own (a probe saw 10 s of shutdown for a grace of 5)."""
    env: LongLeaseEnv = {
        "AGENT_RUNTIME_SHUTDOWN_GRACE_S": "8",
        "AGENT_RUNTIME_LEASE_SECONDS": "600",
    }
    stopping = ServerProcess(data_dir, pg_schema_url, **env).start()
    api = ServerProcess(data_dir, pg_schema_url, no_worker=True, **env).start()
    try:
        # A request whose body comes a byte at a time: uvicorn waits for it to finish.
        slow = socket.create_connection(("127.0.0.1", stopping.port))
        head = "".join(f"{k}: {v}\r\n" for k, v in OPS.items())
        slow.sendall(
            f"POST /runs HTTP/1.1\r\nHost: x\r\n{head}Content-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n{".encode()
        )
        time.sleep(0.5)
        assert stopping.proc is not None
        stopping.proc.terminate()
        time.sleep(1.0)  # the shutdown has begun; the slow request is still being read
        slow.sendall(b" ")
        with api.client() as http:
            run_id = create_run(http, agent_id="slow_worker", input="sleep 0")
            time.sleep(2.0)  # a worker claims at once (it is woken by the run's notice)
            assert http.get(f"/runs/{run_id}").json()["state"] == "pending"
        slow.close()
        assert stopping.proc.wait(30) in (0, -15)
    finally:
        stopping.stop()
        api.stop()
