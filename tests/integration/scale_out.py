"""What the multi-process tests share: waits on states and leases, run helpers, constants.

Every wait is on a state, an event, a log line or a file, with a bounded timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypedDict

import httpx
import psycopg

from tests.integration.server_proc import (
    WorkerProcess,
)

EAST = {"scope": ["sales_region:east"]}
QUESTION = "上周华东区销售下滑的主要 SKU 是什么？"
SEED = 20240522


class QuickExitEnv(TypedDict):
    """Extra environment for a child process; typed, so ``**`` can only fill ``**env``."""

    AGENT_RUNTIME_SHUTDOWN_GRACE_S: str


# Shutting down a worker at the end of a test should not wait out a 30 s sleep.
QUICK_EXIT: QuickExitEnv = {"AGENT_RUNTIME_SHUTDOWN_GRACE_S": "0.5"}


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def runs_in_state(http: httpx.Client, state: str) -> set[str]:
    ids: set[str] = set()
    cursor = None
    while True:
        params: dict[str, Any] = {"state": state, "limit": 200}
        if cursor:
            params["cursor"] = cursor
        page = http.get("/runs", params=params).json()
        ids.update(r["run_id"] for r in page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return ids


def wait_all_in_state(
    http: httpx.Client,
    run_ids: Iterable[str],
    state: str,
    timeout: float,
    give_up: Callable[[], str | None] = lambda: None,
) -> None:
    """Wait until every run is in ``state``; fail at once if one failed or ``give_up`` says."""
    wanted = set(run_ids)
    missing: set[str] = set()

    def done() -> bool:
        reason = give_up()
        assert reason is None, reason
        missing.clear()
        missing.update(wanted - runs_in_state(http, state))
        failed = wanted & runs_in_state(http, "failed")
        assert not failed, describe(http, failed)
        return not missing

    try:
        wait_until(done, timeout, f"{len(wanted)} runs to be {state}", every=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {len(missing)} are not:\n{describe(http, missing)}") from None


def describe(http: httpx.Client, run_ids: Iterable[str], most: int = 3) -> str:
    """What a stuck run looks like: state, tool calls, events."""
    out = []
    for run_id in sorted(run_ids)[:most]:
        run = http.get(f"/runs/{run_id}").json()
        calls = [
            (c["tool"], c["status"], c["attempts"])
            for c in http.get(f"/runs/{run_id}/tool-calls").json()
        ]
        events = [
            (e["seq"], e["type"], e["data"].get("to") or e["data"].get("tool"))
            for e in events_of(http, run_id)
        ]
        out.append(f"{run_id} {run['state']} outcome={run.get('outcome')} calls={calls}")
        out.append(f"  events={events}")
    return "\n".join(out)


def create_run(http: httpx.Client, **body: Any) -> str:
    resp = http.post("/runs", json=body)
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["run_id"]
    return run_id


def events_of(http: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    resp = http.get(f"/runs/{run_id}/events", headers={"Accept": "application/json"})
    resp.raise_for_status()
    events: list[dict[str, Any]] = resp.json()
    return events


def pending_approval(http: httpx.Client, run_id: str) -> str:
    run = http.get(f"/runs/{run_id}").json()
    assert run["state"] == "waiting_human", run
    approval_id: str = run["pending_approval"]["approval_id"]
    return approval_id


def start_workers(*workers: WorkerProcess) -> None:
    """Start several at once (they import in parallel), then wait for each."""
    for worker in workers:
        worker.start(wait=False)
    for worker in workers:
        worker.wait_started()


class Leases:
    """Reads the runs table directly: which runs a worker process holds a lease on."""

    def __init__(self, database_url: str) -> None:
        self.conn = psycopg.connect(database_url, autocommit=True)

    def held_by(self, pid: int) -> list[str]:
        # default_owner() is "<host>:<pid>:<random>"; a released lease has no owner.
        rows = self.conn.execute(
            "SELECT run_id FROM runs WHERE lease_owner LIKE %s", (f"%:{pid}:%",)
        ).fetchall()
        return [r[0] for r in rows]

    def versions(self) -> dict[str, int]:
        rows = self.conn.execute("SELECT run_id, lease_version FROM runs").fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def close(self) -> None:
        self.conn.close()


def takeovers(versions: dict[str, int]) -> int:
    """Claims beyond the two a retail run needs (to start, and after its approval)."""
    return sum(max(0, v - 2) for v in versions.values())
