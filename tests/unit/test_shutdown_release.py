"""A drive's release still in its first try when the shutdown's grace ends: the drive is
cancelled and stops waiting for it, the shutdown returns, and the store closes. That
try failing then must not start a background retry (runtime.release.release_when_back)
that outlives the shutdown and tries the closed store for a lease.

The database's silence is injected into the store's one release (the blip fixtures
cannot aim at one statement of a drive)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from runtime.model import RunCreate
from runtime.tooling import ToolContext, ToolSpec
from server.host import open_host
from server.settings import Settings
from tests.unit.test_outcome_blip import shipper_of
from tools.registry import ToolRegistry


class NoArgs(BaseModel):
    pass


async def ship(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
    return {}


async def test_no_release_is_tried_after_the_shutdown(data_dir: Path, database_url: str) -> None:
    settings = Settings(
        data_dir=data_dir, database_url=database_url, lease_seconds=4.0, default_agent="shipper"
    )
    tries: list[float] = []
    agents = shipper_of(ToolRegistry([ToolSpec("ship", "1", "Ship.", NoArgs, ship)]))
    async with open_host(settings, agents, run_worker=False) as host:
        engine = host.engine
        run, _ = await engine.create_run(RunCreate(agent_id="shipper", input="x"))
        release = engine.store.release_lease

        first = asyncio.Event()

        async def unanswered_then_refused(*args: Any, **kwargs: Any) -> bool | None:
            tries.append(time.monotonic())
            first.set()
            if len(tries) == 1:
                await asyncio.sleep(1.0)  # the database does not answer for a while
                raise sqlite3.OperationalError("database is locked")
            return await release(*args, **kwargs)

        engine.store.release_lease = unanswered_then_refused  # type: ignore[method-assign]
        version = await engine.store.take_lease(run.run_id, engine.owner, engine.lease_s)
        assert version is not None
        engine.start_drive(run.run_id, version)
        await asyncio.wait_for(first.wait(), 30)
        await engine.shutdown(grace_s=0.2)
    closed_at = time.monotonic()
    await asyncio.sleep(2.0)  # the first try fails meanwhile; a retry would follow
    assert [t for t in tries if t > closed_at] == []
    assert not [t for t in engine.releases.releasing if not t.done()]
