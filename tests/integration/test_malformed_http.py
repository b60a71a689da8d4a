"""A request that is not valid HTTP never reaches the app: uvicorn's parser refuses it.
The real server answers it as every other error, problem+json with a machine code,
and goes on serving."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

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
