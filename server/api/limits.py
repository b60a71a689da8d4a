"""Requests are checked before any route sees them: no NUL in the path or query
(PostgreSQL text cannot hold one), no %-escape that is not UTF-8, and bodies are read
whole, bounded, JSON by their Content-Type, and UTF-8.

Content-Length alone is no limit: a chunked body has none. And JSON nested a few
thousand levels deep would blow the parser's (or a validator's) recursion before
any schema is checked, so depth is counted on the raw bytes first. An object that
names a key twice is refused: parsers disagree on which one counts (Python's takes
the last, many take the first), so a proxy or an audit log could read a decision as
the opposite of the one carried out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.errors import Code
from runtime.events import summarize
from server.api.problems import problem_response

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


def json_depth_over(body: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays/objects deeper than ``limit`` (strings skipped)."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False  # cannot be that deep: skip the scan
    depth = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen[key] = value
    return seen


def duplicate_key(body: bytes) -> str | None:
    """A key some object of the JSON ``body`` names twice, if any (None too for a body
    that is not JSON: the route's own parsing says what is wrong with it)."""
    try:
        json.loads(body, object_pairs_hook=_unique)
    except _Duplicate as dup:
        return dup.key
    except (ValueError, RecursionError):
        return None
    return None


def _not_utf8_text(body: bytes) -> str | None:
    """What keeps ``body`` from being UTF-8 JSON text, if anything. A raw NUL byte is
    never JSON (UTF-16 and UTF-32 hold one in every ASCII character)."""
    if b"\x00" in body:
        return "the body holds a NUL byte: JSON text is sent as UTF-8, NUL escaped"
    try:
        body.decode()
    except UnicodeDecodeError:
        return "the body is not UTF-8 JSON text"
    return None


def is_json(media_type: bytes) -> bool:
    """``application/json`` or ``application/…+json``, parameters aside (as FastAPI
    reads a body as JSON)."""
    essence = media_type.split(b";", 1)[0].strip().lower()
    return essence == b"application/json" or (
        essence.startswith(b"application/") and essence.endswith(b"+json")
    )


def _unkeepable(raw_path: bytes, query: bytes) -> str | None:
    """What is wrong with a path or query no store could keep as sent: a NUL
    (PostgreSQL text cannot hold one), or percent-escapes that are not UTF-8 (decoded,
    each would quietly become U+FFFD, and name something else)."""
    for part in (raw_path, query):
        text = unquote_to_bytes(part)
        if b"\x00" in text:
            return "the path or query contains a NUL character"
        try:
            text.decode()
        except UnicodeDecodeError:
            return "the path or query is not UTF-8 once its %-escapes are decoded"
    return None


def _unreadable_as_sent(
    headers: Iterable[tuple[bytes, bytes]],
) -> tuple[str, dict[str, str]] | None:
    """Why a body cannot be read as the JSON its headers say it is (a 415's detail and
    the header naming what would do), or None."""
    # Every one: FastAPI parses by the first, a dict of them keeps the last.
    media_types = [value for name, value in headers if name == b"content-type"]
    codings = [value for name, value in headers if name == b"content-encoding"]
    if len(media_types) != 1 or not is_json(media_types[0]):
        # Read as JSON it may be, but FastAPI would not parse it (its content types
        # are strict) and would answer that the object sent is not an object.
        detail = "the body must be sent with one Content-Type: application/json"
        return detail, {"Accept-Post": "application/json"}  # RFC 9110 §15.5.16
    if any(value.strip().lower() not in (b"", b"identity") for value in codings):
        # Not decoded anywhere: a compressed body was read as the JSON it is not, or
        # worse, a body that only claims a coding was read as sent.
        detail = "the body must be sent uncompressed (no Content-Encoding)"
        return detail, {"Accept-Encoding": "identity"}  # RFC 9110 §12.5.3
    return None


class RequestLimits:
    def __init__(
        self, app: ASGIApp, *, max_bytes: int, max_depth: int, routers: Sequence[APIRouter]
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.body_routes = [
            route
            for router in routers
            for route in router.routes
            if isinstance(route, APIRoute) and route.body_field is not None
        ]

    def _reads_a_body(self, scope: Scope) -> bool:
        """Whether a route that takes a body answers the request: elsewhere the
        routing's own answer (404, 405), or the route's, which ignores the body, is
        the right one, not 415."""
        return any(route.matches(scope)[0] is Match.FULL for route in self.body_routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path")
        problem = _unkeepable(scope.get("raw_path") or b"", scope.get("query_string", b""))
        if problem is not None or "\x00" in (path or ""):
            detail = problem or "the path or query contains a NUL character"
            response = problem_response(Code.VALIDATION_ERROR, detail, instance=None)
            await response(scope, receive, send)
            return
        if scope["method"] not in _WITH_BODY:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._too_large(scope, receive, send, path)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send, path)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        reads_it = self._reads_a_body(scope)
        refusal = _unreadable_as_sent(scope["headers"]) if body and reads_it else None
        if refusal is not None:
            detail, hint = refusal
            response = problem_response(Code.UNSUPPORTED_MEDIA_TYPE, detail, instance=path)
            response.headers.update(hint)
            await response(scope, receive, send)
            return
        not_text = _not_utf8_text(body) if reads_it else None
        if not_text is not None:
            # Python's json reads UTF-16 and UTF-32 too, by their NUL bytes: not what
            # RFC 8259 exchanges, nor what the depth count below reads byte by byte.
            response = problem_response(Code.VALIDATION_ERROR, not_text, instance=path)
            await response(scope, receive, send)
            return
        if reads_it and json_depth_over(body, self.max_depth):
            response = problem_response(
                Code.JSON_TOO_DEEP, f"JSON nests deeper than {self.max_depth}", instance=path
            )
            await response(scope, receive, send)
            return
        twice = duplicate_key(body) if reads_it and body else None
        if twice is not None:
            # ASCII: a lone surrogate in a key cannot be sent.
            name = summarize(json.dumps(twice), 80)
            response = problem_response(
                Code.VALIDATION_ERROR,
                f"a JSON object names the key {name} twice: which one is meant cannot be told",
                instance=path,
            )
            await response(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)

    async def _too_large(
        self, scope: Scope, receive: Receive, send: Send, path: str | None
    ) -> None:
        response = problem_response(
            Code.PAYLOAD_TOO_LARGE, f"body over {self.max_bytes} bytes", instance=path
        )
        await response(scope, receive, send)
