"""The request-head cap of server.wire, read by read: the protocol fed the bytes a
client sends, split as the network may split them, with a transport that keeps what
the server writes. (The real server's answers are in tests/integration.)"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from server.wire import MAX_HEAD_BYTES, ProblemHttpToolsProtocol


async def drain(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body, then answers 200."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


class Transport:
    def __init__(self) -> None:
        self.out, self.closing = b"", False

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(key, default)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def set_protocol(self, protocol: Any) -> None: ...


async def feed(reads: list[bytes]) -> tuple[int | None, bytes, int]:
    """(the read after which the connection was closed, or None; what was answered;
    the most the cap's count reached)."""
    config = uvicorn.Config(drain, ws="none", log_level="error", lifespan="off")
    protocol = ProblemHttpToolsProtocol(config, ServerState(), {}, _loop=asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    peak = 0
    for i, data in enumerate(reads):
        protocol.data_received(data)
        for _ in range(3):  # the app's cycle, a held read's parse
            await asyncio.sleep(0)
        peak = max(peak, protocol._unparsed)
        if transport.closing:
            return i, transport.out, peak
    return None, transport.out, peak


CHUNKED = b"POST /u HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_chunk_framing_split_across_reads_is_no_large_head() -> None:
    """Each chunk's CRLF in a read of its own was counted and never paid back: a 431
    after ~32 KiB of a body under the body cap."""
    reads = [CHUNKED, *([b"1\r\n", b"x", b"\r\n"] * 40_000), b"0\r\n\r\n"]
    closed, answer, peak = await feed(reads)
    assert closed is None and b"431" not in answer and peak < 64


async def test_tiny_chunks_give_the_next_head_no_credit() -> None:
    """Tiny chunks were credited more framing than they took: the next request's head,
    begun in the same read, was held to ~512 KiB before the 431 (the cap is 64 KiB)."""
    tiny = CHUNKED + b"1\r\nx\r\n" * 30_000 + b"0\r\n\r\n"
    reads = [tiny + b"GET /h HTTP/1.1\r\nHost: x\r\nX-Big: ", *[b"z" * 16384] * 40]
    closed, answer, _ = await feed(reads)
    assert closed is not None and closed * 16384 <= MAX_HEAD_BYTES + 16384
    assert b"431 " in answer


async def test_requests_split_anywhere_are_never_a_large_head() -> None:
    rnd = random.Random(1)
    requests = []
    for i in range(300):
        kind = rnd.randrange(3)
        if kind == 0:
            header = b"a" * rnd.randrange(0, 3000)
            requests.append(b"GET /h%d HTTP/1.1\r\nHost: x\r\nX-A: %s\r\n\r\n" % (i, header))
        elif kind == 1:
            body = b"b" * rnd.randrange(0, 5000)
            requests.append(b"POST /p HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        else:
            sizes = [rnd.randrange(1, 700) for _ in range(rnd.randrange(1, 20))]
            chunks = b"".join(b"%x\r\n%s\r\n" % (n, b"c" * n) for n in sizes)
            requests.append(CHUNKED + chunks + b"0\r\nX-Tr: t\r\n\r\n")
    sent = b"".join(requests)
    for _ in range(10):
        cuts = sorted(rnd.sample(range(1, len(sent)), rnd.randrange(5, 400)))
        reads = [sent[a:b] for a, b in zip([0, *cuts], [*cuts, len(sent)], strict=True)]
        closed, answer, _ = await feed(reads)
        assert closed is None and b"431" not in answer
