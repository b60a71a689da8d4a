"""POST /runs with an idempotency key: one run per key, conflicts on a different body."""

from __future__ import annotations

import asyncio

from tests.api.conftest import Api
from tests.auth import bearer

BODY = {"agent_id": "typo_fixer", "input": "echo"}


async def test_same_key_same_body_returns_the_same_run(api: Api) -> None:
    body = {**BODY, "options": {"idempotency_key": "k-1"}}
    first = await api.client.post("/runs", json=body)
    second = await api.client.post("/runs", json=body)
    assert first.status_code == 201 and second.status_code == 200
    assert first.headers["location"] == f"/runs/{first.json()['run_id']}"
    assert second.json()["run_id"] == first.json()["run_id"]
    assert second.headers["location"] == first.headers["location"]


async def test_same_key_different_body_is_409(api: Api) -> None:
    await api.client.post("/runs", json=BODY, headers={"Idempotency-Key": "k-2"})
    resp = await api.client.post(
        "/runs", json={**BODY, "input": "something else"}, headers={"Idempotency-Key": "k-2"}
    )
    assert resp.status_code == 409 and resp.json()["code"] == "IDEMPOTENCY_CONFLICT"
    runs = (await api.client.get("/runs")).json()["items"]
    assert len(runs) == 1


async def test_header_and_body_key_must_agree(api: Api) -> None:
    resp = await api.client.post(
        "/runs",
        json={**BODY, "options": {"idempotency_key": "a"}},
        headers={"Idempotency-Key": "b"},
    )
    assert resp.status_code == 422 and resp.json()["code"] == "VALIDATION_ERROR"


async def test_keys_are_scoped_per_tenant(api: Api) -> None:
    one = await api.client.post("/runs", json=BODY, headers={"Idempotency-Key": "k-3"})
    t2 = bearer(user="u-ops-001", tenant="t2")
    two = await api.client.post("/runs", json=BODY, headers={**t2, "Idempotency-Key": "k-3"})
    assert one.status_code == two.status_code == 201
    assert one.json()["run_id"] != two.json()["run_id"]
    assert two.json()["context"]["tenant_id"] == "t2"


async def test_concurrent_retries_create_one_run(api: Api) -> None:
    responses = await asyncio.gather(
        *(api.client.post("/runs", json=BODY, headers={"Idempotency-Key": "k-4"}) for _ in range(8))
    )
    assert sorted(r.status_code for r in responses) == [200] * 7 + [201]
    assert len({r.json()["run_id"] for r in responses}) == 1
    run_id = responses[0].json()["run_id"]
    final = await api.settle(run_id)
    assert final["state"] == "succeeded"
    assert len((await api.client.get("/runs")).json()["items"]) == 1


async def test_alias_post_run_and_listing(api: Api) -> None:
    resp = await api.client.post("/run", json=BODY)
    assert resp.status_code == 201
    run_id = resp.json()["run_id"]
    await api.settle(run_id)
    for _ in range(3):
        await api.settle((await api.create(agent_id="typo_fixer", input="more"))["run_id"])
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {
            "limit": 2,
            "agent_id": "typo_fixer",
            **({"cursor": cursor} if cursor else {}),
        }
        page = (await api.client.get("/runs", params=params)).json()
        seen += [r["run_id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 4 and run_id in seen
    done = (await api.client.get("/runs", params={"state": "succeeded"})).json()["items"]
    assert run_id in [r["run_id"] for r in done]
    # Given more than once, any of them (it was the last one given).
    for states in (["succeeded", "failed"], ["failed", "succeeded"]):
        either = (await api.client.get("/runs", params={"state": states})).json()["items"]
        assert {r["run_id"] for r in either} == {r["run_id"] for r in done}
    assert (await api.client.get("/runs", params={"state": "failed"})).json()["items"] == []
    # So is an agent (it was the last one given too).
    other = (await api.create(agent_id="wanderer", input="x"))["run_id"]
    for agents in (["typo_fixer", "wanderer"], ["wanderer", "typo_fixer"]):
        page = (await api.client.get("/runs", params={"agent_id": agents})).json()
        assert {r["run_id"] for r in page["items"]} == {*seen, other}
    too_long = await api.client.get("/runs", params={"agent_id": ["a", "b" * 101]})
    assert too_long.status_code == 422, too_long.text


async def test_an_empty_key_is_refused(api: Api) -> None:
    """Found by the fuzz test: an empty header slipped past the body's min_length."""
    resp = await api.client.post("/runs", json=BODY, headers={"Idempotency-Key": ""})
    assert resp.status_code == 422 and resp.json()["code"] == "VALIDATION_ERROR"
    runs, _ = await api.engine_services.store.list_runs()
    assert runs == []


async def test_a_key_header_must_be_printable_ascii(api: Api) -> None:
    # Read as latin-1, "café" would become "cafÃ©": another key than the same in the body.
    resp = await api.client.post("/runs", json=BODY, headers={b"Idempotency-Key": "café".encode()})
    assert resp.status_code == 422 and resp.json()["code"] == "VALIDATION_ERROR"
    assert (await api.client.get("/runs")).json()["items"] == []


async def test_two_key_headers_are_refused(api: Api) -> None:
    """Which one would name the run? Not the first, silently."""
    resp = await api.client.post(
        "/runs", json=BODY, headers=[("Idempotency-Key", "k-a"), ("Idempotency-Key", "k-b")]
    )
    assert resp.status_code == 422 and resp.json()["code"] == "VALIDATION_ERROR"
    assert (await api.client.get("/runs")).json()["items"] == []
