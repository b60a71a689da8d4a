"""A cancel of a run nobody drives stops it at once (DESIGN §7): a run queued behind
busy workers, or parked for a human, does not wait for a free slot or a lease time."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.api.conftest import Api, make_settings, open_api, states
from tests.api.helpers import parked_demo_run, problem
from tests.api.test_cancel_in_flight import transfer_started


async def occupy_the_only_slot(api: Api) -> str:
    busy = await api.create(agent_id="transferrer", input="last 30")
    await api.wait_event(busy["run_id"], transfer_started)
    return str(busy["run_id"])


async def test_a_queued_run_is_cancelled_without_waiting_for_a_slot(
    database_url: str, data_dir: Path
) -> None:
    settings = make_settings(database_url, data_dir, worker_concurrency=1)
    async with open_api(settings) as api:
        busy = await occupy_the_only_slot(api)
        queued = (await api.create(agent_id="transferrer", input="last 1"))["run_id"]

        resp = await api.client.post(f"/runs/{queued}/cancel", json={"reason": "not needed"})

        assert resp.status_code == 200, resp.text
        final = resp.json()
        assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_CANCELLED"
        assert final["outcome"]["message"].startswith("not needed")
        # It never started: nothing planned, nothing in the ledger.
        assert states(await api.events(queued)) == ["pending", "failed"]
        assert (await api.client.get(f"/runs/{queued}/tool-calls")).json() == []
        view = (await api.client.get(f"/runs/{queued}/checkpoint")).json()
        assert view["planner_context_url"] is None, view  # no step to point at
        # The slot's own run went on meanwhile; the worker takes nothing more of it.
        assert (await api.client.get(f"/runs/{busy}")).json()["state"] == "executing"
        lease = await api.engine.store.lease_of(queued)
        assert lease is not None and lease["lease_owner"] is None and not lease["needs_drive"]
        resp = await api.client.post(f"/runs/{busy}/cancel", json={"reason": "done"})
        assert resp.status_code == 200, resp.text


async def test_a_parked_run_is_cancelled_while_the_workers_are_busy(
    database_url: str, data_dir: Path
) -> None:
    settings = make_settings(database_url, data_dir, worker_concurrency=1)
    async with open_api(settings) as api:
        parked = (await api.create())["run_id"]
        assert (await api.settle(parked))["state"] == "waiting_human"
        busy = await occupy_the_only_slot(api)

        resp = await api.client.post(f"/runs/{parked}/cancel", json={"reason": "too late"})

        assert resp.status_code == 200, resp.text
        final = resp.json()
        assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_CANCELLED"
        assert final["pending_approval"] is None
        resp = await api.client.post(f"/runs/{busy}/cancel", json={"reason": "done"})
        assert resp.status_code == 200, resp.text


async def test_a_cancel_landing_before_its_drive_starts_still_stops_the_run(
    database_url: str, data_dir: Path
) -> None:
    """A drive task cancelled before its first step never runs: it neither finished the
    cancel nor gave its lease back, and the run waited out the lease (30 s) instead."""
    settings = make_settings(database_url, data_dir, worker_concurrency=1)
    async with open_api(settings) as api:
        busy = await occupy_the_only_slot(api)
        queued = (await api.create(agent_id="transferrer", input="last 1"))["run_id"]
        engine, store = api.engine, api.engine.store
        version = await store.take_lease(queued, engine.owner, engine.lease_s)
        assert version is not None
        assert await store.request_cancel(queued, "stop", compensate=False)

        engine.start_drive(queued, version)
        engine.on_cancel_notice(queued)  # before the drive's task has run at all

        final = await asyncio.wait_for(engine.wait_settled(queued), 10)
        assert final.state.value == "failed" and final.outcome is not None
        assert final.outcome.code == "RUN_CANCELLED"
        resp = await api.client.post(f"/runs/{busy}/cancel", json={"reason": "done"})
        assert resp.status_code == 200, resp.text


async def test_a_run_whose_cancel_was_accepted_takes_no_decision(
    database_url: str, data_dir: Path
) -> None:
    """Accepted and not yet carried out (as by another process's server, every worker
    busy): approving now would say the run resumes, and it never will."""
    settings = make_settings(database_url, data_dir, worker_concurrency=1)
    async with open_api(settings) as api:
        parked, approval_id, _ = await parked_demo_run(api)
        busy = await occupy_the_only_slot(api)
        assert await api.engine.store.request_cancel(parked, "too late", False)

        problem(await api.decide(parked, approval_id, "approve"), 409, "RUN_STATE_CONFLICT")

        resp = await api.client.post(f"/runs/{busy}/cancel", json={"reason": "done"})
        assert resp.status_code == 200, resp.text
        final = await api.settle(parked)
        assert final["state"] == "failed" and final["outcome"]["code"] == "RUN_CANCELLED"
        expired = await api.client.get(f"/approvals?state=expired&run_id={parked}")
        assert [a["approval_id"] for a in expired.json()] == [approval_id], expired.text
        # Once the cancel is carried out, the same answer (not "decided differently":
        # nobody decided it; the run ended and took its approvals with it).
        late = problem(await api.decide(parked, approval_id, "approve"), 409, "RUN_STATE_CONFLICT")
        assert late["approval_status"] == "expired", late
