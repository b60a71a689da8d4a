"""Every response the API tests receive, checked against the app's own OpenAPI document:
a client generated from it must be able to read whatever the server really sends.

For the operation the request reached (the route the app matches, by method and path
template): its status is declared, its Content-Type is one of that status's media
types (none where none is declared), a JSON body validates against the declared
schema, and each header of :data:`WATCHED` it carries is declared on that response.
A request no documented operation serves (an unknown path, a 405, /openapi.json) is
not checked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from jsonschema import Draft202012Validator
from starlette.routing import Match

WATCHED = ("Location", "Link", "ETag", "Retry-After", "Preference-Applied", "WWW-Authenticate")
"""Headers a client acts on: where a run is, the next page, when to retry, what was
applied, how to authenticate."""


@dataclass
class Tally:
    """How many responses were checked (and passed by, undocumented), over the session:
    a check that never runs proves nothing."""

    apps: int = 0
    """Apps the tests opened (tests.api.conftest.open_api), hook or no hook."""
    checked: int = 0
    undocumented: int = 0
    seconds: float = 0.0
    """Spent checking: what the check adds to the suite."""


TALLY = Tally()


def _essence(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _covers(declared: str, media_type: str) -> bool:
    """Whether a declared media type (or range: ``*/*``, ``text/*``) covers one sent."""
    if declared in ("*/*", media_type):
        return True
    return declared.endswith("/*") and media_type.startswith(declared[:-1])


def _is_json(media_type: str) -> bool:
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


@dataclass
class Contract:
    app: FastAPI
    document: dict[str, Any] = field(init=False)
    _validators: dict[tuple[str, str, str, str], Draft202012Validator] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.document = self.app.openapi()

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any]] | None:
        """The path template and operation that serve ``method path``, if documented."""
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        for route in iter_route_contexts(self.app.routes):  # through included routers
            if isinstance(route.original_route, APIRoute) and (
                route.matches(scope)[0] is Match.FULL
            ):
                template = str(route.path_format)
                found = self.document["paths"].get(template, {}).get(method.lower())
                return None if found is None else (template, found)
        return None

    def validator(
        self, template: str, method: str, status: str, media_type: str, schema: dict[str, Any]
    ) -> Draft202012Validator:
        key = (template, method, status, media_type)
        if key not in self._validators:
            # "#/components/…" references resolve against the root the schema sits in.
            root = {**schema, "components": self.document.get("components", {})}
            self._validators[key] = Draft202012Validator(root)
        return self._validators[key]

    async def check(self, response: httpx.Response) -> None:
        started = time.perf_counter()
        try:
            await self._check(response)
        finally:
            TALLY.seconds += time.perf_counter() - started

    async def _check(self, response: httpx.Response) -> None:
        request = response.request
        # HEAD is served as the GET it stands for (server.api.head), and not documented.
        method = "GET" if request.method == "HEAD" else request.method
        found = self.operation(method, request.url.path)
        if found is None:
            TALLY.undocumented += 1
            return
        template, operation = found
        where = (
            f"{request.method} {request.url.path} ({method} {template}) → {response.status_code}"
        )
        status = str(response.status_code)
        declared = operation["responses"].get(status)
        assert declared is not None, (
            f"{where}: status not declared (declared: {sorted(operation['responses'])})"
        )

        await response.aread()
        content = declared.get("content") or {}
        sent = response.headers.get("content-type")
        if not content:
            assert not response.content, f"{where}: a body where none is declared"
        elif response.content or request.method == "HEAD":
            assert sent is not None, f"{where}: no Content-Type"
            media_type = _essence(sent)
            matching = [m for m in content if _covers(m, media_type)]
            assert matching, f"{where}: Content-Type {sent} not among {sorted(content)}"
            schema = content[matching[0]].get("schema")
            # Bytes declared as bytes (an artifact) are not read as JSON, whatever they hold.
            raw = schema is not None and schema.get("format") == "binary"
            if _is_json(media_type) and request.method != "HEAD" and schema and not raw:
                validator = self.validator(template, method, status, matching[0], schema)
                errors = sorted(validator.iter_errors(response.json()), key=str)
                assert not errors, f"{where}: body does not match its schema: {errors[0]}"

        documented = {name.lower() for name in declared.get("headers", {})}
        for name in WATCHED:
            assert name not in response.headers or name.lower() in documented, (
                f"{where}: header {name} not declared"
            )
        TALLY.checked += 1
