"""Requests that are not valid HTTP (a bad Content-Length, a broken request line) are
refused by uvicorn's parser before any app code runs, with a plain-text 400. This
protocol gives them the problem+json every other error has, and refuses a request
head (request line and headers) larger than :data:`MAX_HEAD_BYTES`, which httptools
would otherwise buffer whole, however large, for a caller not yet authenticated; the
same for a chunked body's trailers, which uvicorn keeps with the headers.

It also sees a client hang up behind a request pipelined on its connection, and tells
every request of the connection, not only the newest (uvicorn's): the stream the
second request waited behind never learned its client had gone, its slot held until
the run ended, days for a parked one; ten such connections shut the caller out of
streams and waits. uvicorn stops reading while a request waits its turn; here the
connection is still read (so its end is seen), what comes is held, and it is parsed
once the waiting request's turn has come, in order."""

from __future__ import annotations

import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from runtime.errors import Code
from server.api.problems import problem_body

MAX_HEAD_BYTES = 64 * 1024
"""The most a request's line and headers may take (nginx allows 32 KiB by default), and
the most its trailers may (httptools hands them over as headers, which uvicorn holds)."""


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (uvicorn[standard], what ``serve`` runs on), its 400
    for a request it cannot parse as problem+json, and a 431 for too large a head."""

    _head_bytes = 0
    """The current request's line and headers as the parser has handed them over; once
    its head is complete, its trailers (a chunked body's headers, held as uvicorn's
    request headers until the body ends)."""
    _unparsed = 0
    """What its reads held that the parser has not handed over yet: the head while it
    is incomplete (the parser holds a header until it ends), then a trailer not ended."""
    _consumed = 0
    """Bytes of the read being parsed that the parser has handed over: the heads (sized
    as sent in canonical form, ``Name: value``), bodies, trailers and chunk framing of
    the requests that began or went on in it."""
    _begun_at: int | None = None
    """Where in the read being parsed the current request began; None: in an earlier
    read, so that the whole read is the current request's."""
    _open = False
    """A request has begun and its body has not ended."""
    _chunk = 0
    """The data of the chunk being parsed, so far."""
    _in_head = False
    _too_large = False
    _cycles: tuple[RequestResponseCycle, ...] = ()
    """The connection's requests not answered yet: the one running, those queued."""
    _held = b""
    """Read while a request waited behind another, not parsed yet (see the module)."""

    def data_received(self, data: bytes) -> None:
        if self.pipeline or self._held:
            self._held += data
            if len(self._held) > MAX_HEAD_BYTES:
                self.flow.pause_reading()  # as uvicorn does: a hang-up is seen at a write
            return
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        self._consumed, self._begun_at = 0, None
        super().data_received(data)
        if not self._open or self.transport.is_closing():
            return
        # What the read held of the request still open counts, not the requests before
        # it in the same read (hundreds of small pipelined ones are no large head).
        if self._in_head:
            self._unparsed += max(0, len(data) - (self._begun_at or 0))
        else:
            # A running balance: framing split across reads is paid back when its chunk
            # completes, in a later read.
            self._unparsed = max(0, self._unparsed + len(data) - self._consumed)
        if self._unparsed > MAX_HEAD_BYTES:
            self._refuse_head()

    def on_message_begin(self) -> None:
        self._in_head, self._head_bytes, self._unparsed = True, 0, 0
        self._open, self._begun_at = True, self._consumed
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self._open = False
        super().on_message_complete()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + 4  # ": " and CRLF
        self._count(size)
        if not self._in_head:  # a trailer: no longer held by the parser
            self._consumed += size
            self._unparsed = 0
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        # METHOD SP url SP HTTP/1.1 CRLF, the headers, CRLF; what earlier reads held of
        # it was counted in _unparsed.
        head = len(self.parser.get_method()) + 14 + self._head_bytes
        self._consumed += max(0, head - self._unparsed)
        self._head_bytes = self._unparsed = 0  # from here on, the trailers
        super().on_headers_complete()
        unanswered = tuple(c for c in self._cycles if not c.response_complete)
        if self.cycle is not None and self.cycle not in unanswered:
            unanswered += (self.cycle,)
        self._cycles = unanswered
        if self.pipeline:  # this one waits its turn: uvicorn stopped reading
            self.flow.resume_reading()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # the next waiting request's turn, if any
        if self._held and not self.pipeline and not self.transport.is_closing():
            # Not from within the response's last send, where uvicorn never parses.
            self.loop.call_soon(self._parse_held)

    def _parse_held(self) -> None:
        data, self._held = self._held, b""
        if data and not self.transport.is_closing():
            self._parse(data)

    def connection_lost(self, exc: Exception | None) -> None:
        for cycle in self._cycles:
            if not cycle.response_complete:
                cycle.disconnected = True
            cycle.message_event.set()
        super().connection_lost(exc)

    def on_body(self, body: bytes) -> None:
        self._consumed += len(body)
        self._chunk += len(body)
        super().on_body(body)

    def on_chunk_header(self) -> None:
        self._chunk = 0

    def on_chunk_complete(self) -> None:
        # Its size line and the CRLF after its data (the last chunk's: "0", the final
        # CRLF); a chunk extension is not counted, and counts as unparsed.
        self._consumed += len(f"{self._chunk:x}") + 4

    def _count(self, size: int) -> None:
        """A head (or trailers) that arrived whole in one read: raising stops the
        parser, which reports a callback error (send_400_response), answered as a 431."""
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._too_large = True
            raise ValueError("request head too large")

    def send_400_response(self, msg: str) -> None:
        if self._too_large:
            self._refuse_head()
        else:
            self._refuse(b"400 Bad Request", Code.MALFORMED_REQUEST, msg)

    def _may_answer(self) -> bool:
        """Whether a status line written now is read as the refused request's answer: not
        while a response streams (it would be its data), nor while an earlier request
        waits for its own (it would be taken for that one's)."""
        unanswered = [c for c in self._cycles if not c.response_complete]
        if self.cycle is not None and not self.cycle.response_complete:
            unanswered += [] if self.cycle in unanswered else [self.cycle]
        if self._in_head:  # a request of its own, not yet one of these
            return not unanswered
        mine = self.cycle is not None and not self.cycle.response_started
        return not unanswered or (mine and unanswered == [self.cycle])

    def _refuse_head(self) -> None:
        self._refuse(
            b"431 Request Header Fields Too Large",
            Code.HEADERS_TOO_LARGE,
            f"the request line and headers, or the trailers, exceed {MAX_HEAD_BYTES} bytes",
        )

    def _refuse(self, status: bytes, code: Code, msg: str) -> None:
        if not self._may_answer():
            self.transport.close()
            return
        body = json.dumps(problem_body(code, msg)).encode()
        content = [b"HTTP/1.1 " + status + b"\r\n"]
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
