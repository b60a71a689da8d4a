"""The OpenAPI document declares no more than the server sends (tests.api.contract checks
that it declares all the API tests receive): a refusal only with codes of its status,
no authentication failures where none is asked, no body limits where none is read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from runtime.errors import CODES, Code
from server.api.problems import PROBLEM_JSON
from server.app import create_app
from tests.api.conftest import Api, make_settings


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The document of an app never started: it needs no database."""
    tmp = tmp_path_factory.mktemp("openapi")
    (tmp / "data").mkdir()
    app = create_app(make_settings(f"sqlite:///{tmp / 'runtime.db'}", Path(tmp / "data")))
    return app.openapi()


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    ]


def test_every_refusal_is_a_problem_of_codes_with_that_status(document: dict[str, Any]) -> None:
    for method, path, operation in operations(document):
        for status, response in operation["responses"].items():
            if int(status) < 400:
                continue
            where = f"{method} {path} {status}"
            assert set(response["content"]) == {PROBLEM_JSON}, where
            codes = re.findall(r"`([A-Z_]+)`", response["description"])
            assert codes, where
            assert {CODES[Code(code)].http_status for code in codes} == {int(status)}, where


def test_a_route_declares_only_what_it_can_be_refused_with(document: dict[str, Any]) -> None:
    assert set(document["paths"]["/healthz"]["get"]["responses"]) == {"200", "422"}
    for method, path, operation in operations(document):
        statuses = set(operation["responses"])
        secured = bool(operation.get("security")) or path == "/metrics"
        assert ("401" in statuses) == secured, (method, path)
        assert ("503" in statuses) == (path != "/healthz"), (method, path)  # the database
        takes_body = "requestBody" in operation
        assert ("415" in statuses) == takes_body == ("413" in statuses), (method, path)


def test_headers_are_declared_where_they_are_sent(document: dict[str, Any]) -> None:
    paths = document["paths"]
    for path, method in (
        ("/approvals", "get"),
        ("/audit", "get"),
        ("/memory", "get"),
        ("/runs/{run_id}/events", "get"),
    ):
        assert "Link" in paths[path][method]["responses"]["200"]["headers"], path
    created = paths["/runs"]["post"]["responses"]
    assert {"Location", "Preference-Applied"} <= set(created["201"]["headers"])
    artifact = paths["/artifacts/{artifact_id}"]["get"]["responses"]
    assert artifact["200"]["content"] == {"*/*": {"schema": {"type": "string", "format": "binary"}}}
    assert "content" not in artifact["304"] and "ETag" in artifact["304"]["headers"]
    assert "Retry-After" in paths["/readyz"]["get"]["responses"]["503"]["headers"]


def test_post_run_is_documented_as_the_alias_of_post_runs(document: dict[str, Any]) -> None:
    runs, run = document["paths"]["/runs"]["post"], document["paths"]["/run"]["post"]
    assert run["operationId"] != runs["operationId"]
    assert run["x-alias-of"] == runs["operationId"]
    assert not run.get("deprecated")  # DESIGN §5: part of the stable surface
    assert run["responses"] == runs["responses"]
    assert run["requestBody"] == runs["requestBody"]


async def test_every_operation_that_reads_a_body_refuses_one_not_sent_as_json(api: Api) -> None:
    """The body checks (server.api.limits) know the routes that read a body from the
    routers the app is built with: a route added any other way would read a text body
    as none (a cancel's {"compensate": true} ignored). The document lists them all."""
    document = (await api.client.get("/openapi.json")).json()
    reading = [
        (method, re.sub(r"\{[^}]+\}", "x", path))
        for method, path, operation in operations(document)
        if "requestBody" in operation
    ]
    assert ("POST", "/runs/x/cancel") in reading
    for method, path in reading:
        resp = await api.client.request(
            method, path, content=b"{}", headers={"Content-Type": "text/plain"}
        )
        assert resp.status_code == 415, (method, path, resp.text)


def test_parameter_bounds_are_json_schema(document: dict[str, Any]) -> None:
    """A number's bounds are ``minimum``/``maximum``, which clients read: a validator in
    a type of its own made them ``ge``/``le``, which none does."""
    params = {
        (path, p["name"]): p["schema"]
        for path, operations in document["paths"].items()
        for operation in operations.values()
        for p in operation.get("parameters", [])
    }
    for where, schema in params.items():
        for branch in schema.get("anyOf", [schema]):
            assert not {"ge", "le", "gt", "lt"} & branch.keys(), (where, schema)
    assert params[("/runs", "limit")] | {"default": None} == {
        "type": "integer",
        "minimum": 1,
        "maximum": 200,
        "default": None,
        "title": "Limit",
    }
    step = params[("/runs/{run_id}/planner-context/{step}", "step")]
    assert (step["minimum"], step["maximum"]) == (0, 10**6)
