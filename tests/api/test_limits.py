"""Limits: body size (chunked too), JSON depth, bad bytes, active runs per tenant, open
event streams per caller. Each past its limit is a clear 4xx, and nothing is written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from server.settings import Settings
from tests.api.conftest import Api, make_settings, open_api
from tests.api.helpers import count_runs, problem
from tests.auth import bearer


async def test_chunked_body_over_the_limit_is_413(api: Api) -> None:
    limit = api.settings.max_body_bytes
    body = b'{"input": "' + b"x" * limit + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 8192):
            yield body[i : i + 8192]

    # A generator body goes out chunked, with no Content-Length to check up front.
    resp = await api.client.post(
        "/runs", content=chunks(), headers={"Content-Type": "application/json"}
    )
    problem(resp, 413, "PAYLOAD_TOO_LARGE")
    assert await count_runs(api) == 0


async def test_declared_length_over_the_limit_is_413(api: Api) -> None:
    body = b'{"input": "' + b"x" * api.settings.max_body_bytes + b'"}'
    resp = await api.client.post(
        "/runs", content=body, headers={"Content-Type": "application/json"}
    )
    problem(resp, 413, "PAYLOAD_TOO_LARGE")
    assert await count_runs(api) == 0


@pytest.mark.parametrize("depth", [33, 5_000, 100_000])
async def test_deep_json_is_422(api: Api, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    body = '{"input": "q", "context": {"deep": ' + nested + "}}"
    resp = await api.client.post(
        "/runs", content=body.encode(), headers={"Content-Type": "application/json"}
    )
    problem(resp, 422, "JSON_TOO_DEEP")
    assert await count_runs(api) == 0


async def test_brackets_inside_strings_do_not_count_as_depth(api: Api) -> None:
    resp = await api.client.post(
        "/runs", json={"input": "[" * 500 + "{" * 500, "agent_id": "typo_fixer"}
    )
    assert resp.status_code == 201, resp.text


@pytest.mark.parametrize(
    "raw",
    [
        b'{"input": "\xff\xfe bad bytes"}',
        b'{"input": "\xc3\x28"}',
        b'{"input": "unterminated',
        b"\xef\xbb\xbf\xef\xbb\xbf",
    ],
)
async def test_invalid_utf8_and_broken_json_are_4xx(api: Api, raw: bytes) -> None:
    resp = await api.client.post("/runs", content=raw, headers={"Content-Type": "application/json"})
    assert 400 <= resp.status_code < 500, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert resp.json()["code"] == "VALIDATION_ERROR"
    assert await count_runs(api) == 0


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/runs", {"limit": 201}),
        ("/runs", {"limit": 0}),
        ("/runs", {"limit": -1}),
        ("/approvals", {"limit": 501}),
        ("/runs", {"cursor": "x" * 501}),
    ],
)
async def test_page_sizes_are_bounded(api: Api, path: str, params: dict[str, int | str]) -> None:
    problem(await api.client.get(path, params=params), 422, "VALIDATION_ERROR")


@pytest.fixture
def limited(database_url: str, data_dir: Path) -> Settings:
    return make_settings(
        database_url, data_dir, max_active_runs_per_tenant=2, max_streams_per_principal=1
    )


async def test_active_runs_per_tenant_are_capped(limited: Settings) -> None:
    async with open_api(limited) as api:
        client = api.client
        slow = {"agent_id": "slow_worker", "input": "sleep 30"}
        ids = [(await client.post("/runs", json=slow)).json()["run_id"] for _ in range(2)]
        third = await client.post("/runs", json=slow)
        problem(third, 429, "TENANT_RUN_LIMIT")
        assert int(third.headers["retry-after"]) > 0
        page = (await client.get("/runs")).json()["items"]
        assert {r["run_id"] for r in page} == set(ids)
        # Another tenant has its own allowance.
        other = await client.post("/runs", json=slow, headers=bearer(tenant="acme"))
        assert other.status_code == 201
        # Once one run ends, there is room again.
        await client.post(f"/runs/{ids[0]}/cancel")
        await api.engine.wait_settled(ids[0])
        cancelled = (await client.get(f"/runs/{ids[0]}")).json()
        assert cancelled["state"] == "failed", cancelled
        assert (await client.post("/runs", json=slow)).status_code == 201
        for run in (await client.get("/runs")).json()["items"]:
            await client.post(f"/runs/{run['run_id']}/cancel")


@pytest.mark.parametrize(
    "url",
    [
        "/runs/run-a%00b",
        "/artifacts/%00",
        "/approvals?run_id=%00",
        "/runs?agent_id=x%00",
        "/runs?cursor=AAA%3D",  # base64 of NUL bytes
        "/runs/run-a/events?after=1%00",
    ],
)
async def test_nul_in_path_or_query_is_422(api: Api, url: str) -> None:
    problem(await api.client.get(url), 422, "VALIDATION_ERROR")


@pytest.mark.parametrize(
    "url",
    ["/runs/run-%FF", "/runs?agent_id=%C3", "/approvals?run_id=a%E9b", "/memory?user_id=%FF"],
)
async def test_escapes_that_are_not_utf8_are_422_not_a_replacement_character(
    api: Api, url: str
) -> None:
    """Decoded, %FF would be U+FFFD: a name the client never sent (and an erasure on
    the audit trail under it)."""
    found = problem(await api.client.get(url), 422, "VALIDATION_ERROR")
    assert "UTF-8" in found["detail"]
    assert (await api.client.delete(url)).status_code == 422
