"""HEAD on every GET route: the GET's status and headers, no body (RFC 9110 §9.3.2)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.api.conftest import EAST, QUESTION, Api
from tests.api.helpers import parked_demo_run, problem


async def test_head_answers_as_get_without_the_body(api: Api) -> None:
    created = await api.client.post(
        "/runs", json={"input": QUESTION, "context": EAST}, headers={"Prefer": "wait=30"}
    )
    parked: dict[str, Any] = created.json()
    assert parked["state"] == "waiting_human", parked
    for path in ("/healthz", f"/runs/{parked['run_id']}", "/runs", "/approvals"):
        got = await api.client.get(path)
        head = await api.client.head(path)
        assert got.status_code == head.status_code == 200, (path, head.text)
        assert head.content == b"" and got.content != b""
        assert head.headers["content-length"] == got.headers["content-length"], path
        assert head.headers["content-type"] == got.headers["content-type"], path


async def test_head_of_a_stream_that_would_not_end_ends_and_frees_its_slot(api: Api) -> None:
    created = await api.client.post(
        "/runs", json={"input": QUESTION, "context": EAST}, headers={"Prefer": "wait=30"}
    )
    run_id = created.json()["run_id"]  # parked: its stream stays open until it moves on
    async with asyncio.timeout(30):  # a bound on a hang, not a speed
        head = await api.client.head(f"/runs/{run_id}/events")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"].startswith("text/event-stream")
    assert head.headers["vary"] == "Accept"  # the same URL is also a JSON page
    assert not api.engine_services.streams.open  # nobody is left holding a slot


async def test_head_refused_as_get_would_be(api: Api) -> None:
    missing = await api.client.head("/runs/run-missing")
    assert missing.status_code == 404 and missing.content == b""
    assert missing.headers["content-type"] == "application/problem+json"
    # A path with no GET has no HEAD either; one with GET names both.
    only_post = await api.client.head("/runs/run-missing/cancel")
    assert only_post.status_code == 405 and only_post.headers["allow"] == "POST"
    problem(await api.client.delete("/healthz"), 405, "METHOD_NOT_ALLOWED")
    assert (await api.client.delete("/healthz")).headers["allow"] == "GET, HEAD"


async def test_head_of_an_artifact_answers_as_get_without_reading_its_bytes(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A HEAD read the whole blob to send none of it: seconds for 100 MB."""
    _, _, artifact_id = await parked_demo_run(api)
    path = f"/artifacts/{artifact_id}"
    got = await api.client.get(path)
    store = api.engine_services.store
    reads: list[str] = []
    read = store.artifact_content

    async def counted(of: str) -> bytes | None:
        reads.append(of)
        return await read(of)

    monkeypatch.setattr(store, "artifact_content", counted)
    head = await api.client.head(path)

    assert head.status_code == got.status_code == 200 and head.content == b""
    shown = ("content-length", "content-type", "content-disposition", "etag")
    assert [head.headers[h] for h in shown] == [got.headers[h] for h in shown]
    assert int(head.headers["content-length"]) == len(got.content) > 0
    assert reads == []
    missing = await api.client.head("/artifacts/sha256:" + "0" * 64)
    assert missing.status_code == 404 and missing.content == b""
