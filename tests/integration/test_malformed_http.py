"""A request that is not valid HTTP never reaches the app: uvicorn's parser refuses it.
The real server answers it as every other error, problem+json with a machine code,
and goes on serving."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.wire import MAX_HEAD_BYTES
from tests.auth import OPS
from tests.integration.conftest import _serving
from tests.integration.server_proc import ServerProcess

MALFORMED = {
    "bad content-length": b"POST /runs HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
    "two content-lengths": (
        b"POST /runs HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    ),
    "broken request line": b"GARBAGE\r\n\r\n",
    "bad header name": b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
}


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data_dir = tmp_path_factory.mktemp("data")
    for server in _serving(f"sqlite:///{data_dir / 'runtime.db'}", data_dir):
        yield server.start()


def exchange(server: ServerProcess, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):  # the server closes the connection
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize("raw", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_http_is_a_problem_json_400(running: ServerProcess, raw: bytes) -> None:
    status, headers, body = exchange(running, raw)
    assert status == 400
    assert headers["content-type"] == "application/problem+json"
    assert int(headers["content-length"]) == len(body)
    problem = json.loads(body)
    assert problem["code"] == "MALFORMED_REQUEST" and problem["status"] == 400
    assert problem["detail"]
    with running.client(OPS) as http:  # and the server goes on
        assert http.get("/healthz").status_code == 200


UPGRADES = {
    "valid": b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
    "without a key": b"",
}


@pytest.mark.parametrize("key", UPGRADES.values(), ids=UPGRADES.keys())
def test_a_websocket_upgrade_is_answered_as_http(running: ServerProcess, key: bytes) -> None:
    """No WebSocket routes: uvicorn does not take the upgrade (it would answer in plain
    text, 403 or 400); the app answers the request, here a 404 problem."""
    raw = (
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\n" + key + b"\r\n"
    )
    status, headers, body = exchange(running, raw)
    assert status == 404 and headers["content-type"] == "application/problem+json"
    assert json.loads(body)["code"] == "NOT_FOUND"


def large_post(extra_headers: bytes = b"") -> bytes:
    """POST /runs as OPS with a 200 kB body (an input too long for the app: its 422)."""
    payload = json.dumps({"input": "x" * 200_000}).encode()
    auth = "".join(f"{k}: {v}\r\n" for k, v in OPS.items()).encode()
    return (
        b"POST /runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + extra_headers
        + auth
        + b"Content-Length: %d\r\n\r\n" % len(payload)
        + payload
    )


def test_a_request_head_too_large_is_431_and_a_large_body_is_not(running: ServerProcess) -> None:
    """httptools buffers a head whole, however large, before any app code (or credential
    check) runs: past MAX_HEAD_BYTES the connection is answered and closed. A body is not
    the head: a large one sent in the same write as a small head reaches the app."""
    huge = b"GET /runs HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 1) + b"\r\n\r\n"
    status, headers, body = exchange(running, huge)
    assert status == 431 and headers["content-type"] == "application/problem+json"
    assert json.loads(body)["code"] == "HEADERS_TOO_LARGE"
    # Many headers add up: each small, together over the cap.
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 1000) for i in range(80))
    status, _, body = exchange(running, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert status == 431 and json.loads(body)["code"] == "HEADERS_TOO_LARGE"
    # Under the cap, a large header is served; and a large body with it is the app's.
    fine = b"X-Big: " + b"c" * (MAX_HEAD_BYTES // 2) + b"\r\n"
    status, _, _ = exchange(
        running, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + fine + b"\r\n"
    )
    assert status == 200
    status, _, body = exchange(running, large_post(b"Connection: close\r\n"))
    assert status == 422 and json.loads(body)["code"] == "VALIDATION_ERROR"  # input too long


def test_a_head_that_never_ends_is_refused_once_past_the_cap(running: ServerProcess) -> None:
    """A caller trickling one endless header: answered once the cap is passed, not
    buffered until the head ends (it never does)."""
    start = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: "
    with socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock:
        # One byte past the cap, and no more: what the server has not read when it
        # closes would make its kernel reset the connection, answer and all.
        sock.sendall(start + b"z" * (MAX_HEAD_BYTES + 1 - len(start)))
        answer = b""
        while chunk := sock.recv(65536):  # the server answers and closes
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert b'"HEADERS_TOO_LARGE"' in answer


def pipelined(server: ServerProcess, first: bytes) -> list[int]:
    """Send ``first`` and the start of a GET /healthz head in one write, the head's end
    in a second: the statuses answered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(first + b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        sock.sendall(b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]


def test_a_large_body_and_the_next_head_in_one_read_are_not_a_large_head(
    running: ServerProcess,
) -> None:
    """Pipelined: a head begun in the read that ends a large body is counted without
    that body (it was, and the head "exceeded" the cap: a 431, the first answer lost);
    nor do a chunked body's trailers count as head."""
    assert pipelined(running, large_post()) == [422, 200]

    big = b"X-Big: " + b"d" * (MAX_HEAD_BYTES - 2048) + b"\r\n"
    trailers = b"".join(b"X-T%d: %s\r\n" % (i, b"t" * 1000) for i in range(6))
    chunked = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n"
        + big
        + b"\r\n5\r\nhello\r\n0\r\n"
        + trailers
        + b"\r\n"
    )
    status, _, _ = exchange(running, chunked)
    assert status == 200


def test_many_small_pipelined_requests_are_not_a_large_head(running: ServerProcess) -> None:
    """Only the head still incomplete counts towards the cap: a burst of small pipelined
    requests, more bytes together than the cap, with the last head cut by the write, is
    answered whole (it was a 431 once the burst passed the cap, the answers lost)."""
    small = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    count = MAX_HEAD_BYTES // len(small) + 200
    statuses = pipelined(running, small * count)
    assert statuses == [200] * (count + 1), (len(statuses), set(statuses))


def send_until_closed(
    server: ServerProcess, start: bytes, more: bytes, answered: bytes = b""
) -> bytes:
    """Send ``start``, wait for the answer to hold ``answered``, then send ``more`` over
    and over (at most 64 MiB) until the server answers and closes; what it answered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(start)
        answer = b""
        while answered not in answer:
            answer += sock.recv(65536)
        with contextlib.suppress(OSError):  # the server closed: a reset, or a broken pipe
            for _ in range((64 << 20) // len(more)):
                sock.sendall(more)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0])


CHUNKED = b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + (
    b"5\r\nhello\r\n0\r\n"
)


@pytest.mark.parametrize(
    "more",
    [b"X-T: " + b"t" * 50 + b"\r\n", b"t" * 4096],
    ids=["endless trailers", "one endless trailer"],
)
def test_trailers_past_the_cap_are_refused(running: ServerProcess, more: bytes) -> None:
    """A chunked body's trailers are header fields uvicorn holds until the body ends
    (an unauthenticated caller grew the server by 630 MB with 170 MB of them): past
    MAX_HEAD_BYTES the connection is answered and closed, and the server goes on."""
    start = CHUNKED + (b"X-Endless: " if len(more) == 4096 else b"")
    rss_before = rss_kib(running.pid)
    answer = send_until_closed(running, start, more)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)[-1:] == [b"431"], answer[:300]
    assert b'"HEADERS_TOO_LARGE"' in answer
    assert rss_kib(running.pid) - rss_before < 32 * 1024  # it held nothing near 64 MiB
    with running.client(OPS) as http:
        assert http.get("/healthz").status_code == 200


@contextlib.contextmanager
def streamed_run(server: ServerProcess, head: bytes = b"") -> Iterator[bytes]:
    """A run that goes on a while; the request head of its event stream, ``head`` added
    (cancelled afterwards)."""
    with server.client(OPS) as http:
        created = http.post("/runs", json={"agent_id": "slow_worker", "input": "sleep 30"})
        run_id = created.json()["run_id"]
    yield (
        (
            f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
            f"Authorization: {OPS['Authorization']}\r\n"
        ).encode()
        + head
        + b"\r\n"
    )
    with server.client(OPS) as http:
        assert http.post(f"/runs/{run_id}/cancel").status_code in (200, 202)


def test_trailers_past_the_cap_behind_a_streaming_answer_end_the_stream(
    running: ServerProcess,
) -> None:
    """Refused while its answer streams: the connection is closed, with no status line
    written into the middle of the stream (a client would read it as event data)."""
    with streamed_run(running, b"Transfer-Encoding: chunked\r\n") as start:
        trailer = b"X-T: " + b"t" * 50 + b"\r\n"
        answer = send_until_closed(running, start + b"0\r\n", trailer, b"event: ")
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert b"event: " in answer and b"HTTP/1.1 431" not in answer


def test_a_refusal_behind_a_streaming_answer_and_a_queued_request_ends_the_stream(
    running: ServerProcess,
) -> None:
    """Pipelined behind an event stream: a request queued, then bytes that are no HTTP.
    The 400 was written into the stream (the refusal looked only at the newest request,
    the queued one, whose answer had not started)."""
    queued_then_garbage = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\r\n\r\n"
    with streamed_run(running) as start:
        answer = send_until_closed(running, start, queued_then_garbage, b"event: ")
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.count(b"HTTP/1.1 ") == 1, answer[-300:]
