"""``Prefer: wait=N`` (RFC 7240) on POST /runs and GET /runs/{id}: the run once it has
settled (parked for a human, or ended), or as it is when the time is up."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.auth.keys import create_key
from server.settings import Settings
from tests.api.conftest import EAST, QUESTION, Api, make_settings, open_api, states
from tests.api.helpers import count_runs, problem
from tests.auth import MGR, OPS_TENANT, bearer

SLOW = {"agent_id": "slow_worker", "input": "sleep 30"}
ADMIN = bearer(user="u-admin-003", roles=["admin"])


def waiting(seconds: int | str) -> dict[str, str]:
    return {"Prefer": f"wait={seconds}"}


async def test_the_demo_flow_without_following_events(api: Api) -> None:
    created = await api.client.post(
        "/runs", json={"input": QUESTION, "context": EAST}, headers=waiting(30)
    )
    assert created.status_code == 201, created.text
    assert created.headers["preference-applied"] == "wait=30"
    assert created.headers["vary"] == "Prefer"
    parked: dict[str, Any] = created.json()
    assert created.headers["location"] == f"/runs/{parked['run_id']}"
    assert parked["state"] == "waiting_human", parked
    approval_id = parked["pending_approval"]["approval_id"]

    resp = await api.decide(parked["run_id"], approval_id, "approve")
    assert resp.status_code == 202, resp.text
    done = await api.client.get(f"/runs/{parked['run_id']}", headers=waiting(30))
    assert done.status_code == 200 and done.headers["preference-applied"] == "wait=30"
    assert done.json()["state"] == "succeeded", done.json()
    # Waiting changed nothing the run records: its log is the whole story.
    assert states(await api.events(parked["run_id"]))[-1] == "succeeded"


@pytest.mark.parametrize(("decision", "ends"), [("approve", "succeeded"), ("reject", "failed")])
async def test_a_decision_waited_on_answers_with_the_run_after_it(
    api: Api, decision: str, ends: str
) -> None:
    """LangGraph resumes through ``runs/wait`` in one request: so can a decision."""
    created = await api.client.post(
        "/runs", json={"input": QUESTION, "context": EAST}, headers=waiting(30)
    )
    parked = created.json()
    path = f"/runs/{parked['run_id']}/approvals/{parked['pending_approval']['approval_id']}"

    resp = await api.client.post(path, json={"decision": decision}, headers={**MGR, **waiting(30)})

    assert resp.status_code == 202 and resp.headers["preference-applied"] == "wait=30"
    answer = resp.json()
    assert answer["status"] == {"approve": "approved", "reject": "rejected"}[decision]
    assert answer["run"]["state"] == ends, answer["run"]
    assert answer["run"] == (await api.client.get(f"/runs/{parked['run_id']}")).json()
    # The same decision again: 200, no second effect, and the run as it ended.
    again = await api.client.post(path, json={"decision": decision}, headers={**MGR, **waiting(5)})
    assert again.status_code == 200 and again.json()["run"]["state"] == ends
    # Without the preference the answer is the approval alone, as it always was.
    plain = await api.client.post(path, json={"decision": decision}, headers=MGR)
    assert "run" not in plain.json() and plain.headers["vary"] == "Prefer"


async def test_without_the_preference_nothing_waits(api: Api) -> None:
    resp = await api.client.post("/runs", json={**SLOW, "context": EAST})
    assert resp.status_code == 201 and resp.json()["state"] == "pending"
    assert "preference-applied" not in resp.headers
    got = await api.client.get(f"/runs/{resp.json()['run_id']}")
    assert "preference-applied" not in got.headers
    # It could have waited: a cache must key on Prefer (RFC 7240 §2).
    assert got.headers["vary"] == "Prefer" and resp.headers["vary"] == "Prefer"
    await api.client.post(f"/runs/{resp.json()['run_id']}/cancel")


async def test_when_the_time_is_up_the_run_comes_as_it_is(api: Api) -> None:
    t0 = time.monotonic()
    created = await api.client.post("/runs", json={**SLOW, "context": EAST}, headers=waiting(1))
    assert time.monotonic() - t0 >= 0.9, "it waited for the time asked"
    assert created.status_code == 201, created.text
    run = created.json()
    assert run["state"] in ("pending", "planning", "executing"), run
    assert created.headers["preference-applied"] == "wait=1"
    t0 = time.monotonic()
    again = await api.client.get(f"/runs/{run['run_id']}", headers=waiting(1))
    assert time.monotonic() - t0 >= 0.9
    assert again.json()["state"] in ("planning", "executing"), again.json()
    await api.client.post(f"/runs/{run['run_id']}/cancel")
    # A run that has ended answers at once, whatever the wait asked for.
    ended = await asyncio.wait_for(
        api.client.get(f"/runs/{run['run_id']}", headers=waiting(3600)), 30
    )
    assert ended.json()["state"] == "failed", ended.json()


@pytest.mark.parametrize(
    ("prefer", "applied"),
    [
        ("wait=0", "wait=0"),
        ("respond-async, wait=5", "wait=5"),
        ('WAIT = "7"; foo=bar', "wait=7"),
        ("wait=999999", "wait=60"),  # the server's max_wait_s
        ("wait=" + "9" * 40, "wait=60"),  # capped too, however long
        ("wait=" + "0" * 40 + "7", "wait=7"),
        ("wait=-1", None),  # not a preference we can read: ignored (RFC 7240 §2)
        ("wait=soon", None),
        ("handling=strict", None),
        ("x" * 5000, None),  # too long to be ours: ignored, not refused
        ("", None),
    ],
)
async def test_the_preference_is_read_as_rfc_7240_says(
    api: Api, prefer: str, applied: str | None
) -> None:
    run = await api.create(agent_id="typo_fixer", input="echo")
    resp = await api.client.get(f"/runs/{run['run_id']}", headers={"Prefer": prefer})
    assert resp.status_code == 200, resp.text
    assert resp.headers.get("preference-applied") == applied
    await api.settle(run["run_id"])


async def test_every_prefer_line_is_read(api: Api) -> None:
    run = await api.create(agent_id="typo_fixer", input="echo")
    resp = await api.client.get(
        f"/runs/{run['run_id']}", headers=[("Prefer", "respond-async"), ("Prefer", "wait=5")]
    )
    assert resp.headers.get("preference-applied") == "wait=5"
    assert resp.json()["state"] == "succeeded"


async def test_waiting_for_an_unknown_run_is_404_at_once(api: Api) -> None:
    resp = await asyncio.wait_for(api.client.get("/runs/run-nope", headers=waiting(3600)), 10)
    problem(resp, 404, "RUN_NOT_FOUND")


@pytest.fixture
def one_stream(database_url: str, data_dir: Path) -> Settings:
    return make_settings(database_url, data_dir, max_streams_per_principal=1)


async def hold_the_slot(api: Api) -> tuple[dict[str, Any], asyncio.Task[httpx.Response]]:
    """A slow run, and a wait on it holding the caller's one stream slot."""
    slow = (await api.client.post("/runs", json={**SLOW, "context": EAST})).json()
    holder = asyncio.create_task(api.client.get(f"/runs/{slow['run_id']}", headers=waiting(30)))
    for _ in range(3000):  # until the wait holds its slot
        if api.engine_services.streams.open:
            break
        await asyncio.sleep(0.01)
    assert api.engine_services.streams.open
    return slow, holder


async def test_a_wait_holds_a_stream_slot_and_a_refused_one_creates_nothing(
    one_stream: Settings,
) -> None:
    async with open_api(one_stream) as api:
        slow, holder = await hold_the_slot(api)
        before = await count_runs(api)
        refused = await api.client.post(
            "/runs", json={"input": QUESTION, "context": EAST}, headers=waiting(30)
        )
        problem(refused, 429, "TOO_MANY_STREAMS")
        assert await count_runs(api) == before, "a refused wait must not leave a run behind"
        # Without waiting, the same caller may still create runs.
        assert (
            await api.client.post("/runs", json={"input": QUESTION, "context": EAST})
        ).status_code == 201
        await api.client.post(f"/runs/{slow['run_id']}/cancel")
        assert (await holder).json()["state"] == "failed"
        assert not api.engine_services.streams.open, "the slot is given back"


async def test_a_run_already_parked_answers_without_a_stream_slot(one_stream: Settings) -> None:
    """Nothing to wait for, so nothing held: not refused with every slot taken."""
    async with open_api(one_stream) as api:
        parked = (
            await api.client.post(
                "/runs", json={"input": QUESTION, "context": EAST}, headers=waiting(30)
            )
        ).json()
        assert parked["state"] == "waiting_human", parked
        slow, holder = await hold_the_slot(api)

        resp = await api.client.get(f"/runs/{parked['run_id']}", headers=waiting(30))

        assert resp.status_code == 200, resp.text
        assert resp.headers["preference-applied"] == "wait=30"
        assert resp.json()["state"] == "waiting_human"
        await api.client.post(f"/runs/{slow['run_id']}/cancel")
        await holder


async def test_a_create_replayed_on_a_parked_run_answers_without_a_stream_slot(
    one_stream: Settings,
) -> None:
    """A client retrying its create (what an idempotency key is for) is not refused
    while its every slot is taken: the replay makes nothing and waits for nothing."""
    async with open_api(one_stream) as api:
        body = {"input": QUESTION, "context": EAST}
        keyed = {**waiting(30), "Idempotency-Key": "retry-me"}
        parked = (await api.client.post("/runs", json=body, headers=keyed)).json()
        assert parked["state"] == "waiting_human", parked
        slow, holder = await hold_the_slot(api)
        before = await count_runs(api)

        again = await api.client.post("/runs", json=body, headers=keyed)
        fresh = await api.client.post(
            "/runs", json=body, headers={**keyed, "Idempotency-Key": "a-new-one"}
        )

        assert again.status_code == 200, again.text
        assert again.headers["preference-applied"] == "wait=30"
        assert again.json()["run_id"] == parked["run_id"]
        assert again.json()["state"] == "waiting_human"
        problem(fresh, 429, "TOO_MANY_STREAMS")  # a run it made would have to wait
        assert await count_runs(api) == before
        await api.client.post(f"/runs/{slow['run_id']}/cancel")
        await holder


async def test_a_decision_repeated_on_an_ended_run_answers_without_a_stream_slot(
    one_stream: Settings,
) -> None:
    """A repeat decides nothing and its run has ended: nothing to wait for, so not
    refused while the approver's every slot is taken. A first decision is refused
    before it decides (a 429 never follows a decision made anyway)."""
    async with open_api(one_stream) as api:
        parked = (
            await api.client.post(
                "/runs", json={"input": QUESTION, "context": EAST}, headers=waiting(30)
            )
        ).json()
        path = f"/runs/{parked['run_id']}/approvals/{parked['pending_approval']['approval_id']}"
        approve, wait = {"decision": "approve"}, {**MGR, **waiting(30)}
        busy = api.engine_services.streams.acquire(("demo-retail", "u-mgr-002"), 1)
        try:
            refused = await api.client.post(path, json=approve, headers=wait)
            problem(refused, 429, "TOO_MANY_STREAMS")
            undecided = await api.engine_services.store.get_approval(path.rsplit("/", 1)[1])
            assert undecided is not None and undecided.status == "pending"
            busy()
            first = await api.client.post(path, json=approve, headers=wait)
            assert first.status_code == 202 and first.json()["run"]["state"] == "succeeded"
            busy = api.engine_services.streams.acquire(("demo-retail", "u-mgr-002"), 1)

            again = await api.client.post(path, json=approve, headers=wait)
        finally:
            busy()

        assert again.status_code == 200, again.text
        assert again.headers["preference-applied"] == "wait=30"
        assert again.json()["run"]["state"] == "succeeded"


async def test_a_decision_repeated_on_a_run_parked_again_answers_without_a_stream_slot(
    one_stream: Settings,
) -> None:
    """Parked on its next approval, the run has nothing to wait for either."""
    async with open_api(one_stream) as api:
        parked = (
            await api.client.post(
                "/runs", json={"agent_id": "double_wirer", "input": "x"}, headers=waiting(30)
            )
        ).json()
        first_approval = parked["pending_approval"]["approval_id"]
        path = f"/runs/{parked['run_id']}/approvals/{first_approval}"
        approve, wait = {"decision": "approve"}, {**MGR, **waiting(30)}
        first = await api.client.post(path, json=approve, headers=wait)
        assert first.status_code == 202, first.text
        again_parked = first.json()["run"]
        assert again_parked["state"] == "waiting_human", again_parked
        assert again_parked["pending_approval"]["approval_id"] != first_approval
        busy = api.engine_services.streams.acquire(("demo-retail", "u-mgr-002"), 1)
        try:
            again = await api.client.post(path, json=approve, headers=wait)
        finally:
            busy()

        assert again.status_code == 200, again.text
        assert again.headers["preference-applied"] == "wait=30"
        assert again.json()["run"] == again_parked


async def revoked_while_waiting(
    api: Api, waiter: Awaitable[httpx.Response], run_id: str, key_id: str
) -> httpx.Response:
    """``waiter``'s answer, its key revoked while it waits, and the wait then ended (the
    run cancelled)."""
    held = asyncio.ensure_future(waiter)
    for _ in range(3000):  # until the wait holds its slot
        if api.engine_services.streams.open or held.done():
            break
        await asyncio.sleep(0.01)
    assert api.engine_services.streams.open, "the request is waiting"
    assert await api.engine_services.store.revoke_api_key(key_id)
    # By an admin of the tenant: the run may be another user's (the key's).
    cancelled = await api.client.post(f"/runs/{run_id}/cancel", headers=ADMIN)
    assert cancelled.status_code in (200, 202), cancelled.text
    resp = await asyncio.wait_for(held, 20)
    assert not api.engine_services.streams.open, "the slot is given back"
    return resp


async def test_a_wait_whose_key_is_revoked_meanwhile_is_refused(api: Api) -> None:
    """An open stream ends at its next check of a revoked key; a waiting request is
    answered only if its credential still holds when the wait ends: what the run did
    after the revocation is not told."""
    key = await create_key(api.engine_services.store, tenant_id=OPS_TENANT, user_id="svc-1")
    slow = (await api.client.post("/runs", json={**SLOW, "context": EAST})).json()
    auth = {"Authorization": f"Bearer {key.token}", **waiting(30)}

    waiter = api.client.get(f"/runs/{slow['run_id']}", headers=auth)
    resp = await revoked_while_waiting(api, waiter, slow["run_id"], key.key_id)

    problem(resp, 401, "UNAUTHENTICATED")


async def test_a_create_whose_key_is_revoked_while_it_waits_says_only_that_it_was_made(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """The run was made while the key held: 201 and where it is (a client retrying
    would make another), as it was made, the wait not applied. The refusal is logged
    as what it is, not as a failure of ours with a traceback."""
    caplog.set_level(logging.INFO, logger="server.api.waiting")
    key = await create_key(api.engine_services.store, tenant_id=OPS_TENANT, user_id="svc-1")
    auth = {"Authorization": f"Bearer {key.token}", **waiting(30)}
    creating = api.client.post("/runs", json=SLOW, headers=auth)
    held = asyncio.ensure_future(creating)
    for _ in range(3000):  # until the run is there
        runs = await api.engine_services.store.list_runs(limit=10)
        if runs[0] or held.done():
            break
        await asyncio.sleep(0.01)
    [run] = runs[0]

    resp = await revoked_while_waiting(api, held, run.run_id, key.key_id)

    assert resp.status_code == 201, resp.text
    assert resp.json()["run_id"] == run.run_id and resp.json()["state"] != "failed"
    assert "preference-applied" not in resp.headers
    [logged] = [r for r in caplog.records if r.name == "server.api.waiting"]
    assert logged.levelno == logging.INFO and logged.exc_info is None, logged
    assert "UNAUTHENTICATED" in logged.getMessage() and run.run_id in logged.getMessage()
