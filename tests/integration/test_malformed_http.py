"""A request that is not valid HTTP never reaches the app: uvicorn's parser refuses it.
The real server answers it as every other error, problem+json with a machine code,
and goes on serving."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator

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


def test_a_large_body_and_the_next_head_in_one_read_are_not_a_large_head(
    running: ServerProcess,
) -> None:
    """Pipelined: a head begun in the read that ends a large body is counted without
    that body (it was, and the head "exceeded" the cap: a 431, the first answer lost);
    nor do a chunked body's trailers count as head."""
    first = large_post()
    with socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock:
        sock.sendall(first + b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        time.sleep(0.3)
        sock.sendall(b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]
    assert statuses == [422, 200], answer[:300]

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
