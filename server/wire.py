"""Requests that are not valid HTTP (a bad Content-Length, a broken request line) are
refused by uvicorn's parser before any app code runs, with a plain-text 400. This
protocol gives them the problem+json every other error has."""

from __future__ import annotations

import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from runtime.errors import Code
from server.api.problems import problem_body


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (uvicorn[standard], what ``serve`` runs on), its 400
    for a request it cannot parse as problem+json."""

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(problem_body(Code.MALFORMED_REQUEST, msg)).encode()
        content = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/problem+json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()


PROTOCOLS: dict[str, Any] = {"http": ProblemHttpToolsProtocol, "ws": "none"}
"""uvicorn's protocols for our servers: unparsable requests answered as problem+json;
no WebSocket protocol (we serve no WebSocket route: an upgrade reaches the app, 404)."""
