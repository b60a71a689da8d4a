"""A short database blip just as a non-idempotent call's handler returns: the call ran,
once, in a live process; only the write of its outcome met the blip. It ends
``succeeded``, recorded once, and the run is not parked for a human.

The blip is real: on PostgreSQL every session of the store's pool is ended
(``pg_terminate_backend``, their application name is the test's own) right before the
handler returns, and again and again for the blip's length, as a failover does; on
SQLite another connection holds the write lock for that long, and the store's writes
wait for it a short time (their busy timeout) before they fail.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from pydantic import BaseModel, ConfigDict

from graphs.run_graph import build_run_graph
from runtime import ids
from runtime.agent import AgentSpec
from runtime.backend import open_backend
from runtime.ledger import INLINE_OUTPUT_BYTES, StoreArtifacts, execute_once, new_ledger_row
from runtime.lifecycle import State
from runtime.model import Decision, Run, RunContext, RunCreate, ToolCall
from runtime.planner import PlannerView
from runtime.policy import DefaultPolicy
from runtime.recording import Recording
from runtime.store.base import RunStore
from runtime.tooling import ToolContext, ToolSpec
from server.host import Host, open_host
from server.settings import Settings
from tests.agents import ScriptPlanner, call, finish
from tests.unit.conftest import MakeRun
from tools.registry import ToolRegistry

BLIP_S = 0.5
BUSY_MS = 50
"""The SQLite store's busy timeout here: a lock held past it fails the write."""


class Blip:
    """The database failing the store's writes for a while, from a given moment."""

    def __init__(self, url: str, admin_url: str | None) -> None:
        self.url = url
        self.admin_url = admin_url  # PostgreSQL: a session outside the store's
        self.app = urlsplit(url).query.rpartition("application_name=")[2]
        self.threads: list[threading.Thread] = []

    def start(self, seconds: float) -> None:
        """From now on, for ``seconds``: returns once the first failure is in place."""
        if self.admin_url is not None:
            self._terminate()  # every pooled session is dead as the handler returns
            until = time.monotonic() + seconds

            def again() -> None:
                while time.monotonic() < until:
                    self._terminate()
                    time.sleep(0.015)

            thread = threading.Thread(target=again)
        else:
            path = self.url.removeprefix("sqlite:///")
            lock = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            lock.execute("BEGIN IMMEDIATE")

            def release() -> None:
                time.sleep(seconds)
                lock.execute("ROLLBACK")
                lock.close()

            thread = threading.Thread(target=release)
        thread.start()
        self.threads.append(thread)

    async def begin(self, seconds: float) -> None:
        """:meth:`start`, off the event loop's thread: SQLite's BEGIN IMMEDIATE waits
        there for a write lock that a connection of this process may hold until the
        loop runs again (the store's, the checkpointer's), and would wait it out."""
        await asyncio.to_thread(self.start, seconds)

    def _terminate(self) -> None:
        assert self.admin_url is not None
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (self.app,),
            )

    def join(self) -> None:
        for thread in self.threads:
            thread.join()

    async def over(self, store: RunStore) -> None:
        """Wait for the blip to end; the test's own reads then find no session it ended
        in the pool (the runtime's writes survive those: they are tried again)."""
        await asyncio.to_thread(self.join)
        pool = getattr(store, "pool", None)
        if pool is not None:
            await pool.check()


@pytest.fixture
def blip(
    database_url: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Blip]:
    if database_url.startswith("sqlite"):
        monkeypatch.setattr("runtime.store.sqlite.BUSY_TIMEOUT_MS", BUSY_MS)
        made = Blip(database_url, None)
    else:
        url = f"{database_url}&application_name=blip_{uuid.uuid4().hex[:12]}"
        made = Blip(url, request.getfixturevalue("pg_base_url"))
    yield made
    made.join()


class ShipArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item: str = "box"
    manifest_kb: int = 0
    """An output this large becomes an artifact: one more write before the outcome's."""


def ship_tool(shipped: list[str], blip: Blip, seconds: float) -> ToolSpec:
    """Non-idempotent, no reconcile: its outcome, once lost, is nobody's to find out."""

    async def ship(args: ShipArgs, ctx: ToolContext) -> dict[str, object]:
        shipped.append(ctx.idempotency_key)
        if len(shipped) == 1:
            await blip.begin(seconds)
        if args.manifest_kb:
            return {"shipped": args.item, "manifest": "x" * 1024 * args.manifest_kb}
        return {"shipped": args.item}

    return ToolSpec("ship", "1", "Ship a box.", ShipArgs, ship, side_effect=True, idempotent=False)


# -- the ledger: execute_once on a real store, under the run's lease -------------


@pytest.fixture
async def store(blip: Blip) -> AsyncIterator[RunStore]:
    backend = await open_backend(blip.url)
    try:
        yield backend.store
    finally:
        await blip.over(backend.store)
        await backend.close()


async def execute(
    store: RunStore,
    run_id: str,
    spec: ToolSpec,
    recording: Recording | None = None,
    ship: ShipArgs | None = None,
) -> ToolCall:
    # A lease of its own, as a drive has: the one before it (left unreleased by a
    # drive that failed) lapses first.
    async with asyncio.timeout(10):
        while True:
            version = await store.take_lease(run_id, "test-worker", 0.3)
            if version is not None:
                break
            await asyncio.sleep(0.05)
    fenced = store.fenced(run_id, version)
    ship = ship or ShipArgs()
    args = ship.model_dump()
    row = new_ledger_row(
        run_id, 0, 0, ids.tool_call_id(run_id, 0, 0), spec, args, ids.content_hash(args)
    )
    tctx = ToolContext(
        run_id=run_id,
        tool_call_id=row.tool_call_id,
        idempotency_key=row.idempotency_key,
        context=RunContext(),
        artifacts=StoreArtifacts(fenced, run_id),
    )
    action = {"tool_call_id": row.tool_call_id, "tool": spec.name}
    return await execute_once(fenced, spec, row, ship, tctx, action, recording=recording)


async def test_an_outcome_whose_write_meets_a_blip_is_recorded(
    store: RunStore, blip: Blip, make_run: MakeRun
) -> None:
    run = await make_run(store)
    shipped: list[str] = []

    row = await execute(store, run.run_id, ship_tool(shipped, blip, BLIP_S))

    assert row.status == "succeeded" and row.output == {"shipped": "box"}, row
    assert row.attempts == 1 and len(shipped) == 1
    await blip.over(store)
    assert await store.get_tool_call(row.tool_call_id) == row
    events = await store.list_events(run.run_id)
    assert [e.type for e in events] == ["state", "action", "result"]
    assert events[-1].data["status"] == "succeeded"


async def test_a_large_outcome_whose_writes_meet_a_blip_is_recorded(
    store: RunStore, blip: Blip, make_run: MakeRun
) -> None:
    """Its artifact is written first: the blip meets that write, and both are tried again."""
    run = await make_run(store)
    shipped: list[str] = []
    ship = ShipArgs(manifest_kb=INLINE_OUTPUT_BYTES // 1024 + 1)

    row = await execute(store, run.run_id, ship_tool(shipped, blip, BLIP_S), ship=ship)

    assert row.status == "succeeded" and row.artifact_id is not None, row
    assert row.attempts == 1 and len(shipped) == 1
    await blip.over(store)
    stored = await store.get_artifact(row.artifact_id)
    assert stored is not None and b'"shipped": "box"' in stored[1]
    events = await store.list_events(run.run_id)
    assert [e.type for e in events] == ["state", "action", "artifact", "result"]
    assert events[-1].data["artifact_id"] == row.artifact_id


async def left_unrecorded(
    store: RunStore, blip: Blip, run_id: str, shipped: list[str]
) -> tuple[ToolSpec, Recording]:
    """A call whose handler ran, and whose outcome a blip kept out of the ledger past a
    lease that may have expired already (nothing was tried again)."""
    spec = ship_tool(shipped, blip, BLIP_S)
    recording = Recording(held_until=lambda: 0.0)
    with pytest.raises((psycopg.OperationalError, sqlite3.OperationalError)):
        await execute(store, run_id, spec, recording)
    await blip.over(store)
    return spec, recording


async def test_an_outcome_unrecorded_past_the_lease_is_recorded_by_the_next_drive(
    store: RunStore, blip: Blip, make_run: MakeRun
) -> None:
    run = await make_run(store)
    shipped: list[str] = []
    spec, recording = await left_unrecorded(store, blip, run.run_id, shipped)
    [left] = await store.list_tool_calls(run.run_id)
    assert left.status == "running" and len(recording.kept) == 1

    row = await execute(store, run.run_id, spec, recording)

    assert row.status == "succeeded" and row.output == {"shipped": "box"}, row
    assert row.attempts == 1 and len(shipped) == 1 and len(recording.kept) == 0
    events = await store.list_events(run.run_id)
    assert [e.type for e in events] == ["state", "action", "result"]


async def test_a_drive_that_does_not_know_the_outcome_says_why_it_is_unknown(
    store: RunStore, blip: Blip, make_run: MakeRun
) -> None:
    run = await make_run(store)
    shipped: list[str] = []
    spec, _ = await left_unrecorded(store, blip, run.run_id, shipped)

    # Another process's drive: it kept nothing.
    row = await execute(store, run.run_id, spec, Recording())

    assert row.status == "unknown" and len(shipped) == 1
    assert row.error == {
        "code": "TOOL_OUTCOME_UNKNOWN",
        "message": "the drive that ran this non-idempotent call stopped before its "
        "outcome was recorded (its process stopped, or the database failed)",
    }


# -- the engine: a run whose call meets the blip -------------------------------


def shipper_of(tools: ToolRegistry, **args: Any) -> dict[str, AgentSpec]:
    """The agent ``shipper``: it calls ``ship`` (with ``args``) once, then finishes."""

    def script(view: PlannerView) -> Decision:
        return finish("shipped") if view.observations else call("ship", **args)

    graph = build_run_graph(ScriptPlanner(script), tools, DefaultPolicy())
    return {"shipper": AgentSpec("shipper", "ships a box", graph, tools)}


def shipper(shipped: list[str], blip: Blip, seconds: float) -> dict[str, AgentSpec]:
    return shipper_of(ToolRegistry([ship_tool(shipped, blip, seconds)]))


async def settled_through(host: Host, blip: Blip, run_id: str) -> Run:
    """The run once it has settled, the blip over (the test's own reads meet it too)."""
    async with asyncio.timeout(60):
        while True:
            try:
                final = await host.engine.wait_settled(run_id, within_s=60)
                break
            except (psycopg.OperationalError, sqlite3.OperationalError):
                await asyncio.sleep(0.1)
    await blip.over(host.store)
    return final


@pytest.mark.parametrize(
    ("lease_s", "blip_s"),
    [(30.0, BLIP_S), (1.0, 2.5)],
    ids=["blip-within-the-lease", "outage-past-the-lease"],
)
async def test_a_run_whose_outcome_meets_a_blip_ends_without_a_human(
    blip: Blip, data_dir: Path, lease_s: float, blip_s: float
) -> None:
    """Within the lease the write is tried again; past it the drive fails, and the next
    one (this process's) records the outcome the engine kept."""
    shipped: list[str] = []
    settings = Settings(
        data_dir=data_dir,
        database_url=blip.url,
        default_agent="shipper",
        lease_seconds=lease_s,
        drive_retry_seconds=0.1,
    )
    async with open_host(settings, shipper(shipped, blip, blip_s)) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="shipper", input="ship"))
        final = await settled_through(host, blip, run.run_id)
        [row] = await host.store.list_tool_calls(run.run_id)
        events = await host.store.list_events(run.run_id)
        approvals = await host.store.list_approvals(run_id=run.run_id)

    assert final.state is State.SUCCEEDED, (final.state, final.outcome, row.error)
    assert len(shipped) == 1 and approvals == []
    assert row.status == "succeeded" and row.attempts == 1 and row.error is None, row
    mine = [e for e in events if e.data.get("tool_call_id") == row.tool_call_id]
    assert [(e.type, e.data.get("status")) for e in mine] == [
        ("action", None),
        ("result", "succeeded"),
    ], mine
    assert not [e for e in events if e.type == "error"], events


async def test_a_failure_that_lasts_holds_the_drive_no_longer_than_a_lease(
    tmp_path: Path,
) -> None:
    """Not a blip: the disk is full for a large output, and not for a renewal's few
    bytes, so the heartbeat goes on renewing the lease. The retries stop a lease after
    the first failure all the same (they followed the renewals, and held the drive, and
    a cancel of its run, for ever); the run is then driven as after any failed drive,
    and a cancel ends it."""
    url = f"sqlite:///{tmp_path / 'runtime.db'}"
    full = Blip(url, None)
    store: list[RunStore] = []
    filled = asyncio.Event()

    async def disk_full(seconds: float) -> None:  # as the handler returns
        conn = store[0]._conn._conn  # type: ignore[attr-defined]  # the store's own
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages + 20}")
        filled.set()

    full.begin = disk_full  # type: ignore[method-assign]
    shipped: list[str] = []
    agents = shipper_of(ToolRegistry([ship_tool(shipped, full, 0)]), manifest_kb=3000)
    settings = Settings(
        data_dir=tmp_path,
        database_url=url,
        default_agent="shipper",
        lease_seconds=1.0,
        drive_retry_seconds=0.1,
    )
    async with open_host(settings, agents) as host:
        store.append(host.store)
        run, _ = await host.engine.create_run(RunCreate(agent_id="shipper", input="ship"))
        await asyncio.wait_for(filled.wait(), 10)
        await asyncio.sleep(2.0)  # two leases: renewed all along
        ended = await host.engine.cancel(run.run_id, "stop", wait_s=5)
    assert ended.state is State.FAILED, ended.state
    assert ended.outcome is not None and ended.outcome.code == "RUN_CANCELLED"
    assert len(shipped) == 1
