"""Helpers the API tests share."""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.conftest import Api


async def parked_demo_run(api: Api) -> tuple[str, str, str]:
    """A demo run parked at its approval: (run_id, approval_id, the report's artifact_id)."""
    run = await api.create()
    await api.wait_event(run["run_id"], lambda e: e["data"].get("to") == "waiting_human")
    events = await api.events(run["run_id"])
    approval_id = next(e for e in events if e["type"] == "approval_request")["data"]["approval_id"]
    artifact_id = next(e for e in events if e["type"] == "artifact")["data"]["artifact_id"]
    return run["run_id"], approval_id, artifact_id


def problem(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = resp.json()
    assert body["code"] == code
    return body


async def corrupt(api: Api, table: str, sets: str, where: str, *params: object) -> None:
    """A stored row changed by hand, as no version of the runtime would write it."""
    async with api.engine_services.store.tx() as tx:
        await tx.execute(f"UPDATE {table} SET {sets} WHERE {where}", params)


def unreadable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows shown in their unreadable form."""
    return [r for r in rows if r.get("unreadable")]


async def count_runs(api: Api) -> int:
    """Every run in the store, whatever its tenant."""
    runs, _ = await api.engine_services.store.list_runs(limit=200)
    return len(runs)
