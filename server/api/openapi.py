"""What the OpenAPI document says a route answers: the statuses it may refuse with,
named by their codes (runtime.errors.CODES gives each its status), and the headers
its responses carry, so that a client generated from the document works.

A route lists every code it can answer with and no other: a status it never sends
is as wrong in a generated client as one it sends undeclared (tests/api/contract.py
checks every response the API tests receive against the document).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from runtime.errors import CODES, Code, Recovery
from server.api.problems import PROBLEM_JSON, Problem

PROBLEM_REF = "#/components/schemas/Problem"

EVERY_REQUEST = (Code.VALIDATION_ERROR,)
"""A path or query no store could keep is refused on any route (server.api.limits),
and a query parameter out of its bounds on any route that takes one."""
AUTHENTICATED = (*EVERY_REQUEST, Code.UNAUTHENTICATED, Code.UNAVAILABLE)
"""A route behind a principal: an API key is looked up in the database, and every
such route reads it, which may be unable to serve (server.api.problems)."""
OF_A_RUN = (*AUTHENTICATED, Code.RUN_NOT_FOUND)
"""A route under ``/runs/{run_id}``: another tenant's run is as absent as none."""
WITH_BODY = (Code.PAYLOAD_TOO_LARGE, Code.UNSUPPORTED_MEDIA_TYPE, Code.JSON_TOO_DEEP)
"""What server.api.limits refuses in the body of a request to a route that reads one,
before the route does."""


def _header(description: str, type_: str = "string") -> dict[str, Any]:
    return {"description": description, "schema": {"type": type_}}


HEADERS: dict[str, dict[str, Any]] = {
    "Location": _header("Where the run is: `/runs/{run_id}`."),
    "Link": _header(
        'The next page: `<path?query>; rel="next"` (RFC 8288), relative to the request;'
        " absent on the last page."
    ),
    "ETag": _header("The artifact's name, quoted: it names these bytes and no others."),
    "Retry-After": _header("Seconds to wait before trying again.", "integer"),
    "Preference-Applied": _header(
        "`wait=N` (N as capped) when the request's `Prefer: wait` was applied."
    ),
    "WWW-Authenticate": _header("`Bearer`: the scheme every authenticated route takes."),
    "Accept-Post": _header("`application/json`: the one media type a body is read as."),
}
"""Every response header the document declares, by name."""

_CODE_HEADERS = {
    Code.UNAUTHENTICATED: ("WWW-Authenticate",),
    Code.UNSUPPORTED_MEDIA_TYPE: ("Accept-Post",),
}
"""Headers a refusal with the code carries besides those of its recovery."""


def headers(*names: str) -> dict[str, dict[str, Any]]:
    """The ``headers`` of a response that carries ``names`` (each from :data:`HEADERS`)."""
    return {name: HEADERS[name] for name in names}


def problem_responses(*codes: Code) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route that may refuse with ``codes``: one per status,
    each status and title taken from the codes table, so a route names codes, never
    numbers. A code whose recovery is a retry says when in ``Retry-After``."""
    by_status: dict[int, list[Code]] = {}
    for code in dict.fromkeys(codes):
        by_status.setdefault(CODES[code].http_status, []).append(code)
    responses: dict[int | str, dict[str, Any]] = {}
    for status, named in sorted(by_status.items()):
        carried = [h for code in named for h in _CODE_HEADERS.get(code, ())]
        if any(CODES[code].recovery is Recovery.RETRY for code in named):
            carried.append("Retry-After")
        response: dict[str, Any] = {
            "description": "; ".join(f"`{code.value}`: {CODES[code].title}" for code in named),
            "content": {PROBLEM_JSON: {"schema": {"$ref": PROBLEM_REF}}},
        }
        if carried:
            response["headers"] = headers(*dict.fromkeys(carried))
        responses[status] = response
    return responses


def install(app: FastAPI) -> None:
    """Put :class:`Problem` in the document's components. FastAPI adds a model there
    only when a response names it as its ``model``, and then also declares it as
    ``application/json``, which no problem is sent as."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = generate()  # kept by FastAPI as app.openapi_schema: changed in place
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        schemas["Problem"] = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
        return document

    app.openapi = openapi  # type: ignore[method-assign]
