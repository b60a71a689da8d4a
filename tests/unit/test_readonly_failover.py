"""A failover's promoted standby refuses writes for a moment as a read-only transaction
(SQLSTATE 25006: an ``InternalError`` to psycopg, not a lost connection). That is the
database away, as a dropped connection is: the drive is handed back and the run goes on
once writes are taken again; it failed INTERNAL_ERROR instead, and the heartbeat, which
took the error for a bug, stopped renewing this process's leases for good."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from pydantic import BaseModel

from runtime.backend import open_backend
from runtime.lifecycle import State
from runtime.memory import Memory
from runtime.model import RunCreate
from runtime.tooling import ToolContext, ToolSpec
from runtime.worker import HEARTBEAT
from server.host import open_host
from server.settings import Settings
from tests.unit.test_outcome_blip import shipper_of
from tools.registry import ToolRegistry

T = TypeVar("T")

READ_ONLY_S = 2.0
"""Longer than the lease below: renewals and the outcome's write both meet it."""


class Failover:
    """A database of the test's own, made read-only for a while, as a promoted standby
    is: every session of it ended, the new ones refused their writes."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.name = f"failover_{uuid.uuid4().hex[:10]}"
        self.url = urlunsplit(urlsplit(admin_url)._replace(path=f"/{self.name}"))
        self.thread: threading.Thread | None = None

    def _admin(self, *statements: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def read_only(self, on: bool) -> None:
        setting = "SET default_transaction_read_only = on" if on else "RESET ALL"
        self._admin(
            f"ALTER DATABASE {self.name} {setting}",
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{self.name}'",
        )

    def start(self) -> None:
        """Returns once the database is read-only; it is writable again later."""
        self.read_only(True)

        def failover() -> None:
            time.sleep(READ_ONLY_S)
            self.read_only(False)

        self.thread = threading.Thread(target=failover)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()


@pytest.fixture
def failover(pg_base_url: str) -> Iterator[Failover]:
    made = Failover(pg_base_url)
    made._admin(f"CREATE DATABASE {made.name}")
    yield made
    made.join()
    made._admin(f"DROP DATABASE {made.name} WITH (FORCE)")


class NoArgs(BaseModel):
    pass


async def served(read: Callable[[], Awaitable[T]]) -> T:
    """The test's own read, through the failover's ended sessions."""
    async with asyncio.timeout(60):
        while True:
            try:
                return await read()
            except psycopg.OperationalError:
                await asyncio.sleep(0.1)


async def test_a_run_whose_database_fails_over_goes_on(failover: Failover, data_dir: Path) -> None:
    shipped: list[str] = []

    async def ship(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
        shipped.append(ctx.idempotency_key)
        if len(shipped) == 1:
            await asyncio.to_thread(failover.start)
            await asyncio.sleep(0.3)  # returns into the read-only database
        return {"shipped": True}

    tools = ToolRegistry(
        [ToolSpec("ship", "1", "Ship.", NoArgs, ship, side_effect=True, idempotent=False)]
    )
    settings = Settings(
        data_dir=data_dir,
        database_url=failover.url,
        default_agent="shipper",
        lease_seconds=1.5,
        drive_retry_seconds=0.1,
    )
    async with open_host(settings, shipper_of(tools)) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="shipper", input="ship"))
        final = await served(lambda: host.engine.wait_settled(run.run_id, within_s=60))
        await asyncio.to_thread(failover.join)
        [row] = await served(lambda: host.store.list_tool_calls(run.run_id))
        assert host.worker is not None
        [heartbeat] = [t for t in host.worker._tasks if t.get_name() == HEARTBEAT]
        assert not heartbeat.done(), heartbeat
        ended = host.engine.metrics.value
        # Met as the database away (the drive handed back), not as a broken drive (one
        # whose run is failed INTERNAL_ERROR, should that write find a session that
        # takes it: here none did, by the failover's timing).
        assert ended("drives_ended_total", how="db_error") >= 1
        assert ended("drives_ended_total", how="failed") == 0

    assert final.state is State.SUCCEEDED, (final.state, final.outcome)
    assert len(shipped) == 1 and row.status == "succeeded" and row.attempts == 1, row


async def test_a_process_starting_in_a_failover_sets_up_once_it_is_over(
    failover: Failover,
) -> None:
    """The schema set-up writes even where the schema is current: a worker restarted
    during the failover crashed, again and again, until it was over."""
    backend = await open_backend(failover.url)  # the schema, as an earlier start left it
    await backend.close()
    await asyncio.to_thread(failover.start)

    started = await open_backend(failover.url)
    try:
        await served(started.store.ping)
    finally:
        await started.close()


async def test_a_failover_that_lasts_ends_the_start_with_its_error(
    failover: Failover, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = await open_backend(failover.url)
    await backend.close()
    monkeypatch.setattr("runtime.backend.SET_UP_WITHIN_S", 0.5)
    await asyncio.to_thread(failover.start)

    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        await open_backend(failover.url)


async def test_a_users_memories_are_listed_while_the_database_is_read_only(
    failover: Failover,
) -> None:
    backend = await open_backend(failover.url)
    try:
        mine = Memory(backend.memory, "t", "u")
        await mine.put("color", {"v": "teal"})
        await asyncio.to_thread(failover.start)

        assert await served(mine.items) == {"color": {"v": "teal"}}
    finally:
        await backend.close()
