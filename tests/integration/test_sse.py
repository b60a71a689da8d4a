"""SSE from a real server: ids are seqs, reconnects replay exactly what was missed."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.auth import MGR, OPS
from tests.integration.conftest import state_is
from tests.integration.scale_out import create_run
from tests.integration.server_proc import ServerProcess


def raw_stream(server: ServerProcess, run_id: str, **headers: str) -> list[tuple[int, str]]:
    """(id, event type) of every event until the server closes the stream."""
    out: list[tuple[int, str]] = []
    current_id = None
    with httpx.stream(
        "GET", f"{server.base_url}/runs/{run_id}/events", headers={**OPS, **headers}, timeout=60
    ) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("id: "):
                current_id = int(line[4:])
            elif line.startswith("event: "):
                assert current_id is not None
                out.append((current_id, line[7:]))
    return out


def test_stream_ids_replay_and_close(server: ServerProcess) -> None:
    server.start()
    with server.client() as http:
        run_id = http.post("/runs", json={"agent_id": "typo_fixer", "input": "x"}).json()["run_id"]
        everything = raw_stream(server, run_id)
        stored = http.get(f"/runs/{run_id}/events", headers={"Accept": "application/json"}).json()
    assert [i for i, _ in everything] == list(range(1, len(everything) + 1))
    assert [(e["seq"], e["type"]) for e in stored] == everything
    assert everything[-1][1] == "state" and stored[-1]["data"]["to"] == "succeeded"
    # The stream closed by itself after the terminal state event (raw_stream returned).
    resumed = raw_stream(server, run_id, **{"Last-Event-ID": "5"})
    assert resumed == everything[5:]
    url = f"{server.base_url}/runs/{run_id}/events?after=7"
    with httpx.stream("GET", url, headers=OPS, timeout=30) as r:
        ids = [int(line[4:]) for line in r.iter_lines() if line.startswith("id: ")]
    assert ids == [i for i, _ in everything[7:]]
    assert raw_stream(server, run_id, **{"Last-Event-ID": str(len(everything))}) == []


def test_live_stream_across_an_approval(server: ServerProcess) -> None:
    server.start()
    with server.client() as http:
        run_id = http.post(
            "/runs",
            json={
                "input": "Which SKUs drove last week's sales drop in the east region?",
                "context": {"scope": ["sales_region:east"]},
            },
        ).json()["run_id"]
        head = server.follow(run_id, state_is("waiting_human"))
        approval_id = head[-2]["data"]["approval_id"]
        assert head[-2]["type"] == "approval_request"
        resp = http.post(
            f"/runs/{run_id}/approvals/{approval_id}", json={"decision": "approve"}, headers=MGR
        )
        assert resp.status_code == 202
        tail = server.follow(run_id, state_is("succeeded", "failed"), after=head[-1]["seq"])
        stored = http.get(f"/runs/{run_id}/events", headers={"Accept": "application/json"}).json()
    assert [e["seq"] for e in head + tail] == list(range(1, len(head) + len(tail) + 1))
    # Sent live (mostly from the commits' own wake-ups, not re-read): exactly the log.
    assert head + tail == stored
    assert tail[0]["type"] == "approval_result" and tail[-1]["data"]["to"] == "succeeded"
    assert "SKU-" in http_get_answer(server, run_id)


def http_get_answer(server: ServerProcess, run_id: str) -> str:
    with server.client() as http:
        answer: str = http.get(f"/runs/{run_id}").json()["result"]["answer"]
        return answer


def test_open_streams_per_caller_are_capped(server: ServerProcess) -> None:
    server.env["AGENT_RUNTIME_MAX_STREAMS_PER_PRINCIPAL"] = "1"
    server.start()
    sse = {"Accept": "text/event-stream"}
    with server.client() as http:
        run_id = http.post("/runs", json={"agent_id": "slow_worker", "input": "sleep 30"}).json()[
            "run_id"
        ]
        url = f"/runs/{run_id}/events"
        with http.stream("GET", url, headers=sse) as first:
            assert first.status_code == 200
            lines = first.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)  # open, holding its slot
            second = http.get(url, headers=sse)
            assert second.status_code == 429, second.text
            assert second.json()["code"] == "TOO_MANY_STREAMS"
            assert int(second.headers["retry-after"]) > 0
            # Another caller is not held back by this one's streams.
            with http.stream("GET", url, headers={**sse, **MGR}) as other:
                assert other.status_code == 200
        # The first stream is closed while the run still runs: its slot comes back once
        # the server sees the connection gone.
        assert http.get(f"/runs/{run_id}").json()["state"] not in ("succeeded", "failed")
        for _ in range(100):
            with http.stream("GET", url, headers=sse) as again:
                if again.status_code == 200:
                    break
            time.sleep(0.05)  # the server notices the closed connection on its next write
        assert again.status_code == 200
        # Only tidying up: 202 means the holder is still stopping it.
        assert http.post(f"/runs/{run_id}/cancel").status_code in (200, 202)


def test_a_wait_whose_client_hangs_up_gives_its_slot_back(server: ServerProcess) -> None:
    server.env["AGENT_RUNTIME_MAX_STREAMS_PER_PRINCIPAL"] = "1"
    server.start()
    with server.client() as http:
        run_id = create_run(http, agent_id="slow_worker", input="sleep 30")
        wait_1s = {"Prefer": "wait=1"}
        request = (
            f"GET /runs/{run_id} HTTP/1.1\r\nHost: test\r\nPrefer: wait=60\r\n"
            f"Authorization: {OPS['Authorization']}\r\n\r\n"
        ).encode()
        hanging = socket.create_connection(("127.0.0.1", server.port))
        hanging.settimeout(3.0)  # ample for the server to take the request (and its slot)
        hanging.sendall(request)
        with pytest.raises(TimeoutError):  # no answer: it waits, holding the one slot
            hanging.recv(1000)
        refused = http.get(f"/runs/{run_id}", headers=wait_1s)
        assert refused.status_code == 429, refused.text
        assert refused.json()["code"] == "TOO_MANY_STREAMS"
        hanging.close()
        # Not 60 s later: once the server sees the connection gone, the slot is free.
        for _ in range(40):
            again = http.get(f"/runs/{run_id}", headers=wait_1s)
            if again.status_code == 200:
                break
            time.sleep(0.05)
        assert again.status_code == 200, again.text
        assert again.headers["preference-applied"] == "wait=1"
        http.post(f"/runs/{run_id}/cancel")


def test_head_of_a_live_stream_answers_at_once_and_holds_no_slot(server: ServerProcess) -> None:
    """Under uvicorn: the headers of the stream, no body, the connection reusable, and
    the caller's one stream slot free again for a real stream."""
    server.env["AGENT_RUNTIME_MAX_STREAMS_PER_PRINCIPAL"] = "1"
    server.start()
    sse = {"Accept": "text/event-stream"}
    with server.client() as http:
        run_id = create_run(http, agent_id="slow_worker", input="sleep 30")
        url = f"/runs/{run_id}/events"
        head = http.head(url, headers=sse)
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-type"].startswith("text/event-stream")
        for _ in range(100):
            with http.stream("GET", url, headers=sse) as stream:
                if stream.status_code == 200:
                    break
            time.sleep(0.05)
        assert stream.status_code == 200
        assert http.post(f"/runs/{run_id}/cancel").status_code in (200, 202)


@pytest.mark.parametrize("later", [False, True], ids=["in-one-write", "a-moment-later"])
def test_a_stream_with_a_request_pipelined_behind_it_gives_its_slot_back(
    server: ServerProcess, later: bool
) -> None:
    """The client sends a second request before the stream's response ends, then hangs
    up: the stream learns it is gone (uvicorn told only the newest request, and stopped
    reading the connection while that one waited), and its slot is free again."""
    server.env["AGENT_RUNTIME_MAX_STREAMS_PER_PRINCIPAL"] = "1"
    server.start()
    with server.client() as http:
        run_id = create_run(http, agent_id="slow_worker", input="sleep 30")
        request = (
            f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: test\r\n"
            f"Authorization: {OPS['Authorization']}\r\n\r\n"
        ).encode()
        piped = socket.create_connection(("127.0.0.1", server.port))
        piped.settimeout(5.0)
        piped.sendall(request if later else request + request)
        assert piped.recv(100).startswith(b"HTTP/1.1 200"), "the stream is open"
        if later:
            time.sleep(0.5)  # the stream waits in its receive()
            piped.sendall(request)
            time.sleep(0.5)
        held = http.get(f"/runs/{run_id}/events")
        assert held.status_code == 429 and held.json()["code"] == "TOO_MANY_STREAMS"
        piped.close()
        for _ in range(40):  # not a keepalive (15 s) later, when a write would fail
            with http.stream("GET", f"/runs/{run_id}/events") as again:
                if again.status_code == 200:
                    break
            time.sleep(0.05)
        assert again.status_code == 200
        http.post(f"/runs/{run_id}/cancel")


OK = b'{"status":"ok"}'


def test_pipelined_requests_are_answered_in_order_on_a_kept_connection(
    server: ServerProcess,
) -> None:
    server.start()
    get = f"GET /healthz HTTP/1.1\r\nHost: test\r\nAuthorization: {OPS['Authorization']}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.settimeout(10.0)
        conn.sendall(get.encode() * 3)
        got = b""
        while got.count(OK) < 3:
            got += conn.recv(65536)
        assert got.count(b"HTTP/1.1 200") == 3 and got.endswith(OK), got
        time.sleep(0.3)
        conn.sendall(get.encode())  # kept alive: a later request on it is answered
        again = b""
        while not again.endswith(OK):
            again += conn.recv(65536)
        assert again.startswith(b"HTTP/1.1 200"), again
