"""Every error leaves as ``application/problem+json`` (RFC 9457) with a machine ``code``."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Mapping
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from runtime.dberrors import unavailable
from runtime.errors import CODES, Code, RuntimeProblem
from server.api.trace import LogGone

log = logging.getLogger(__name__)
PROBLEM_JSON = "application/problem+json"

_HTTP_CODES = {
    404: Code.NOT_FOUND,
    405: Code.METHOD_NOT_ALLOWED,
    406: Code.NOT_ACCEPTABLE,
    413: Code.PAYLOAD_TOO_LARGE,
    415: Code.UNSUPPORTED_MEDIA_TYPE,
    422: Code.VALIDATION_ERROR,
    400: Code.VALIDATION_ERROR,
}


class Problem(BaseModel):
    """RFC 9457 problem details, plus the machine ``code``."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None


_HEADERS = {"retry_after": "Retry-After", "www_authenticate": "WWW-Authenticate"}
"""Extras that a client needs as headers; Retry-After also stays in the body."""


def problem_body(
    code: Code, detail: str, *, instance: str | None = None, status: int | None = None
) -> dict[str, Any]:
    """The problem document of ``code`` (its title and status from the codes table)."""
    info = CODES[code]
    return Problem(
        type=f"https://agent-runtime.dev/problems/{code.value.lower().replace('_', '-')}",
        title=info.title,
        status=status or info.http_status,
        detail=detail,
        code=code.value,
        instance=instance,
    ).model_dump(exclude_none=True)


def problem_response(
    code: Code,
    detail: str,
    *,
    instance: str | None = None,
    status: int | None = None,
    extra: Mapping[str, object] | None = None,
) -> JSONResponse:
    info = CODES[code]
    body = problem_body(code, detail, instance=instance, status=status)
    extra = {k: v for k, v in (extra or {}).items() if v is not None}
    headers = {_HEADERS[k]: str(v) for k, v in extra.items() if k in _HEADERS}
    body.update({k: v for k, v in extra.items() if k != "www_authenticate"})
    return JSONResponse(
        body, status_code=status or info.http_status, media_type=PROBLEM_JSON, headers=headers
    )


_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
"""The methods a route of ours may serve."""


def install(app: FastAPI) -> None:
    @app.exception_handler(RuntimeProblem)
    async def runtime_problem(request: Request, exc: RuntimeProblem) -> JSONResponse:
        return problem_response(exc.code, exc.message, instance=request.url.path, extra=exc.extra)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg")), "type": e.get("type")}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors)
        return problem_response(
            Code.VALIDATION_ERROR,
            detail or "invalid request",
            instance=request.url.path,
            extra={"errors": errors},
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError):
            # FastAPI's 400 for a body its JSON parser refused other than by syntax
            # (bytes that are not UTF-8, an integer past Python's 4,300 digits): 422,
            # as every other body that cannot be read, with the reason.
            return problem_response(
                Code.VALIDATION_ERROR,
                f"the body cannot be read as JSON: {str(exc.__cause__)[:200]}",
                instance=request.url.path,
            )
        code = _HTTP_CODES.get(exc.status_code, Code.INTERNAL_ERROR)
        response = problem_response(
            code, str(exc.detail), instance=request.url.path, status=exc.status_code
        )
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:
            # Every method of the path (RFC 9110 §15.5.6): Starlette names those of the
            # first route it matched, and GET /runs and POST /runs are two routes.
            allowed = [
                method
                for method in _METHODS
                if any(
                    route.matches({**request.scope, "method": method})[0] is Match.FULL
                    for route in request.app.router.routes
                )
            ]
            if "GET" in allowed:  # server/api/head.py
                allowed.insert(allowed.index("GET") + 1, "HEAD")
            response.headers["Allow"] = ", ".join(allowed)
        return response

    @app.exception_handler(psycopg.Error)
    @app.exception_handler(sqlite3.OperationalError)
    async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        if not unavailable(exc):  # bad SQL, a limit: a retry would fail the same way
            return await unexpected(request, exc)
        log.warning("database unavailable on %s: %s", request.url.path, exc)
        return problem_response(
            Code.UNAVAILABLE,
            "the database is unavailable or busy; try again",
            instance=request.url.path,
            extra={"retry_after": 1},
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, LogGone):  # intended (see server.serving.PrunedTraceIsNoError)
            log.warning("%s cut off: %s", request.url.path, exc)
        else:
            log.exception("unhandled error on %s", request.url.path)
        return problem_response(Code.INTERNAL_ERROR, "internal error", instance=request.url.path)
