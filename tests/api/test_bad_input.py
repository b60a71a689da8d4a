"""Bad input gets a 4xx problem+json with a machine code, and leaves no rows behind."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.api.conftest import Api
from tests.api.helpers import parked_demo_run
from tests.auth import MGR

GOOD = {
    "input": "上周华东区销售下滑的主要 SKU 是什么？",
    "context": {"scope": ["sales_region:east"]},
}


async def run_count(api: Api) -> int:
    page = (await api.client.get("/runs", params={"limit": 200})).json()
    return len(page["items"])


def assert_problem(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = resp.json()
    assert body["code"] == code and body["status"] == status and body["detail"]
    return body


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"input": ""},
        {"input": " \n\t\u3000"},  # blank: nothing to plan (most often an empty variable)
        {"input": 123},
        {"input": "x" * 20_001},
        {"input": "q", "context": "not an object"},
        {"input": "q", "context": {"scope": "sales_region:east"}},
        {"input": "q", "options": {"max_steps": 0}},
        {"input": "q", "options": {"max_steps": -5}},
        {"input": "q", "options": {"max_steps": 10**12}},
        {"input": "q", "options": {"budget": {"max_tool_calls": -1}}},
        # Checked before the first plan: a zero would fail the run before it started.
        {"input": "q", "options": {"budget": {"max_llm_calls": 0}}},
        {"input": "q", "options": {"budget": {"max_tokens": 0}}},
        {"input": "q", "options": {"budget": {"max_cost_usd": 0}}},
        {"input": "q", "options": {"budget": {"max_cost_usd": 1e-400}}},  # parsed as 0.0
        {"input": "q", "options": {"budget": {"timeout_s": 0}}},
        {"input": "q", "options": {"budget": {"max_cost_usd": 1e300}}},
        {"input": "q", "options": {"budget": {"gpu_hours": 3}}},
        # A number of another JSON type is not guessed at.
        {"input": "q", "options": {"budget": {"max_tool_calls": "3"}}},
        {"input": "q", "options": {"budget": {"max_tool_calls": True}}},
        {"input": "q", "options": {"budget": {"max_tool_calls": 2.0}}},
        {"input": "q", "options": {"budget": {"timeout_s": "10"}}},
        {"input": "q", "options": {"budget": {"max_cost_usd": "1.0"}}},
        {"input": "q", "options": {"max_steps": "5"}},
        {"input": "q", "surprise": True},
        {"input": "nul \u0000 inside"},
        {"input": "q", "context": {"tenant_id": "t\u0000"}},
        {"input": "q", "context": {"extra": {"deep": ["\u0000"]}}},
        [1, 2, 3],
        "just a string",
    ],
)
async def test_invalid_run_bodies_are_422_and_write_nothing(api: Api, body: Any) -> None:
    resp = await api.client.post("/runs", json=body)
    problem = assert_problem(resp, 422, "VALIDATION_ERROR")
    assert problem["errors"]
    assert await run_count(api) == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"input": "q"',
        b'{"input": "\xff\xfe"}',  # not UTF-8 (FastAPI alone: 400, and no reason)
        b"\x00\x01",
        b'{"input": "q", "context": {"n": ' + b"9" * 4301 + b"}}",  # past Python's digits
    ],
)
async def test_malformed_json_and_bad_encoding_are_422(api: Api, raw: bytes) -> None:
    resp = await api.client.post("/runs", content=raw, headers={"Content-Type": "application/json"})
    assert assert_problem(resp, 422, "VALIDATION_ERROR")["detail"]
    assert await run_count(api) == 0


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
async def test_json_in_another_unicode_encoding_is_422(api: Api, encoding: str) -> None:
    """Python's json would read it (it guesses UTF-16 and UTF-32 by their NUL bytes), and
    the depth limit, counted on the bytes, would not: an escaped quote in UTF-16 ends
    the string as the count reads it, and the nesting after it went uncounted (a run
    that failed INTERNAL_ERROR, or a 500, by depth)."""
    deep = "[" * 300 + "]" * 300
    text = '{"input": "a\\"b", "context": {"extra": {"x": ' + deep + "}}}"
    for body in (json.dumps(GOOD), text):
        resp = await api.client.post(
            "/runs", content=body.encode(encoding), headers={"Content-Type": "application/json"}
        )
        detail = assert_problem(resp, 422, "VALIDATION_ERROR")["detail"]
        assert detail == "the body holds a NUL byte: JSON text is sent as UTF-8, NUL escaped"
    assert await run_count(api) == 0


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [("/nowhere", 404, "NOT_FOUND"), ("/healthz", 405, "METHOD_NOT_ALLOWED")],
)
async def test_a_body_not_sent_as_json_to_no_route_that_reads_one_is_not_415(
    api: Api, path: str, status: int, code: str
) -> None:
    """What is wrong there is the path or the method, not the body's type or depth."""
    resp = await api.client.post(path, content=b"hello", headers={"Content-Type": "text/plain"})
    assert_problem(resp, status, code)
    deep = b"[" * (api.settings.max_json_depth + 5)
    resp = await api.client.post(path, content=deep, headers={"Content-Type": "application/json"})
    assert_problem(resp, status, code)


async def test_a_body_a_route_may_go_without_is_still_415_if_not_json(api: Api) -> None:
    """A cancel's body is optional: read as none, {"compensate": true} sent as text
    would cancel without compensating."""
    run_id = (await api.create())["run_id"]
    sent = json.dumps({"reason": "stop", "compensate": True}).encode()
    resp = await api.client.post(
        f"/runs/{run_id}/cancel", content=sent, headers={"Content-Type": "text/plain"}
    )
    assert_problem(resp, 415, "UNSUPPORTED_MEDIA_TYPE")


@pytest.mark.parametrize("first", ["text/plain", "application/json"])
async def test_two_content_types_are_415(api: Api, first: str) -> None:
    """FastAPI parses by the first, the body check read the last: text, then JSON, was
    a 422 saying the object sent was not an object (a fuzzing helper found)."""
    other = "application/json" if first == "text/plain" else "text/plain"
    sent = [("Content-Type", first), ("Content-Type", other)]
    resp = await api.client.post("/runs", content=json.dumps(GOOD).encode(), headers=sent)
    assert_problem(resp, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await run_count(api) == 0


@pytest.mark.parametrize("coding", ["gzip", "br, identity", "Deflate"])
async def test_a_body_with_a_content_coding_is_415(api: Api, coding: str) -> None:
    """Nothing decodes it: a body that only claimed gzip was read as sent (a fuzzing
    helper found), and a gzipped one as the JSON it is not."""
    sent = {"Content-Type": "application/json", "Content-Encoding": coding}
    resp = await api.client.post("/runs", content=json.dumps(GOOD).encode(), headers=sent)
    assert_problem(resp, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert resp.headers["accept-encoding"] == "identity"
    assert await run_count(api) == 0
    sent["Content-Encoding"] = "identity"
    created = await api.client.post("/runs", content=json.dumps(GOOD).encode(), headers=sent)
    assert created.status_code == 201, created.text


@pytest.mark.parametrize(
    "media_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml", None]
)
async def test_a_body_not_sent_as_json_is_415(api: Api, media_type: str | None) -> None:
    """Not "the object sent is not an object": what is wrong is the Content-Type."""
    body = json.dumps(GOOD).encode()
    sent = {} if media_type is None else {"Content-Type": media_type}
    resp = await api.client.post("/runs", content=body, headers=sent)
    assert_problem(resp, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert resp.headers["accept-post"] == "application/json"
    assert await run_count(api) == 0
    for fine in ("application/json; charset=utf-8", "Application/JSON", "application/x+json"):
        created = await api.client.post("/runs", content=body, headers={"Content-Type": fine})
        assert created.status_code == 201, (fine, created.text)


@pytest.mark.parametrize(
    "raw",
    [
        rb'{"input": "q", "context": {"note": "\ud800"}}',  # a lone surrogate
        rb'{"input": "q", "context": {"\udfff": 1}}',
        rb'{"input": "q", "context": {"scope": ["sales_region:\ud800"]}}',
        rb'{"input": "\ud83d alone"}',
        b'{"input": "q", "context": {"n": 9223372036854775808}}',  # 2**63
        b'{"input": "q", "context": {"n": -9223372036854775809}}',
        b'{"input": "q", "context": {"n": NaN}}',  # not JSON, but Python's parser reads it
        b'{"input": "q", "context": {"n": [Infinity]}}',
        b'{"input": "q", "context": {"n": -1e999}}',
    ],
)
async def test_what_the_stores_cannot_keep_is_422_and_writes_nothing(api: Api, raw: bytes) -> None:
    """Before, these were a 500 (hashing the request) or a run created and then failed
    (the checkpoint's msgpack), or NaN stored and shown as null."""
    resp = await api.client.post("/runs", content=raw, headers={"Content-Type": "application/json"})
    assert_problem(resp, 422, "VALIDATION_ERROR")
    assert await run_count(api) == 0


async def test_what_the_stores_can_keep_is_kept_as_given(api: Api) -> None:
    context = {"scope": ["sales_region:east"], "n": [2**63 - 1, -(2**63), 1.5], "emoji": "😀"}
    run = await api.create(input="东区 😀", context=context)
    got = await api.settle(run["run_id"])  # the drive checkpoints the context too
    assert got["state"] == "waiting_human", got
    assert {k: got["context"][k] for k in context} == context and got["input"] == "东区 😀"


async def test_oversized_body_is_413(api: Api) -> None:
    resp = await api.client.post("/runs", json={"input": "q", "pad": "x" * 300_000})
    assert_problem(resp, 413, "PAYLOAD_TOO_LARGE")
    assert await run_count(api) == 0


async def test_unknown_agent_is_422(api: Api) -> None:
    resp = await api.client.post("/runs", json={**GOOD, "agent_id": "nobody"})
    assert_problem(resp, 422, "AGENT_NOT_FOUND")
    assert await run_count(api) == 0


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/runs/run-missing"),
        ("GET", "/runs/run-missing/events"),
        ("GET", "/runs/run-missing/steps"),
        ("GET", "/runs/run-missing/tool-calls"),
        ("GET", "/runs/run-missing/trace"),
        ("GET", "/runs/run-missing/checkpoint"),
        ("POST", "/runs/run-missing/cancel"),
        ("POST", "/runs/run-missing/approvals/ap-missing"),
    ],
)
async def test_unknown_run_is_404(api: Api, method: str, path: str) -> None:
    body = {"decision": "approve"} if "approvals" in path else None
    resp = await api.client.request(method, path, json=body)
    assert_problem(resp, 404, "RUN_NOT_FOUND")


async def test_unknown_approval_artifact_and_route_are_404(api: Api) -> None:
    run = await api.create(agent_id="typo_fixer", input="x")
    resp = await api.client.post(
        f"/runs/{run['run_id']}/approvals/ap-missing", json={"decision": "approve"}
    )
    assert_problem(resp, 404, "APPROVAL_NOT_FOUND")
    assert_problem(await api.client.get("/artifacts/sha256:" + "0" * 64), 404, "ARTIFACT_NOT_FOUND")
    assert_problem(await api.client.get("/nowhere"), 404, "NOT_FOUND")
    not_allowed = await api.client.delete("/runs")
    assert_problem(not_allowed, 405, "METHOD_NOT_ALLOWED")
    assert set(not_allowed.headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}


async def test_bad_decisions_queries_and_headers_are_422(api: Api) -> None:
    run = await api.create(agent_id="typo_fixer", input="x")
    run_id = run["run_id"]
    for body in (
        {"decision": "maybe"},
        {},
        {"decision": "approve", "comment": "x" * 5000},
        {"decision": "approve", "comment": 5},
    ):
        resp = await api.client.post(f"/runs/{run_id}/approvals/ap-x", json=body)
        assert_problem(resp, 422, "VALIDATION_ERROR")
    refused: list[dict[str, str | int]] = [
        {"state": "sleeping"},
        {"limit": 0},
        {"limit": 10_000},
        {"cursor": "%%%"},
        {"agent_id": ""},  # not "any agent"
    ]
    # A number is its digits: pydantic read the first four as 30, 3, 3 and 3.
    refused += [{"limit": spelled} for spelled in ("3_0", "+3", " 3", "3.0", "³", "٣")]
    for params in refused:
        assert_problem(await api.client.get("/runs", params=params), 422, "VALIDATION_ERROR")
    for path in (f"/runs/{run_id}/events?after=1_0", f"/runs/{run_id}/planner-context/1.0"):
        accept = {"Accept": "application/json"}
        assert_problem(await api.client.get(path, headers=accept), 422, "VALIDATION_ERROR")
    assert (await api.client.get("/runs", params={"limit": "007"})).status_code == 200
    for bad_id in (b"x", "²".encode("latin-1"), b"9" * 20):
        resp = await api.client.get(
            f"/runs/{run_id}/events",
            headers={b"Accept": b"application/json", b"Last-Event-ID": bad_id},
        )
        assert_problem(resp, 422, "VALIDATION_ERROR")
    assert_problem(
        await api.client.get(f"/runs/{run_id}/events", params={"after": 10**30}),
        422,
        "VALIDATION_ERROR",
    )
    assert_problem(
        await api.client.get(f"/runs/{run_id}/events", params={"after": -1}),
        422,
        "VALIDATION_ERROR",
    )


async def test_cancel_of_a_finished_run_is_409(api: Api) -> None:
    run = await api.create(agent_id="typo_fixer", input="x")
    await api.settle(run["run_id"])
    resp = await api.client.post(f"/runs/{run['run_id']}/cancel", json={"reason": "late"})
    assert_problem(resp, 409, "RUN_STATE_CONFLICT")
    for body in ({"compensate": "yes"}, {"compensate": 1}, {"reason": 7}):
        resp = await api.client.post(f"/runs/{run['run_id']}/cancel", json=body)
        assert_problem(resp, 422, "VALIDATION_ERROR")


async def test_a_key_named_twice_is_422_and_decides_nothing(api: Api) -> None:
    """Which of the two counts differs between parsers (Python's took the last): a proxy
    or an audit log reading the first would record the opposite of what was done."""
    json_type = {"Content-Type": "application/json"}
    resp = await api.client.post(
        "/runs", content=b'{"input": "a", "input": "b"}', headers=json_type
    )
    assert '"input" twice' in assert_problem(resp, 422, "VALIDATION_ERROR")["detail"]
    assert await run_count(api) == 0

    run_id, approval_id, _ = await parked_demo_run(api)
    decide = f"/runs/{run_id}/approvals/{approval_id}"
    for body in (
        b'{"decision": "approve", "decision": "reject"}',
        b'{"decision": "approve", "comment": {"a": 1, "a": 2}}',  # at any depth
    ):
        resp = await api.client.post(decide, content=body, headers={**json_type, **MGR})
        assert_problem(resp, 422, "VALIDATION_ERROR")
    approval = (await api.client.get(f"/runs/{run_id}")).json()["pending_approval"]
    assert approval["approval_id"] == approval_id  # still undecided
    resp = await api.client.post(
        f"/runs/{run_id}/cancel",
        content=b'{"compensate": false, "compensate": true}',
        headers=json_type,
    )
    assert_problem(resp, 422, "VALIDATION_ERROR")
    assert (await api.client.get(f"/runs/{run_id}")).json()["state"] == "waiting_human"
    # A key no UTF-8 can carry is named by its escape (its JSON text would be a 500).
    resp = await api.client.post(
        "/runs", content=b'{"input": "q", "x": {"\\ud800": 1, "\\ud800": 2}}', headers=json_type
    )
    assert '"\\ud800" twice' in assert_problem(resp, 422, "VALIDATION_ERROR")["detail"]
    # The same key in two objects is no duplicate.
    resp = await api.client.post(
        "/runs",
        json={"input": "q", "context": {"extra": {"a": {"n": 1}, "b": {"n": 2}}}},
    )
    assert resp.status_code == 201, resp.text
