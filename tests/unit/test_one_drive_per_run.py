"""A process drives a run once at a time: leased again while an earlier drive of its
own still runs it (that drive's lease ran out unrenewed: its event loop was blocked,
or the database away, for a lease), the earlier drive stops at once, as one whose
lease another worker took. On SQLite nothing else would stop it writing checkpoints
beside the new drive until its next store write."""

from __future__ import annotations

import asyncio
from pathlib import Path

from runtime.lifecycle import State
from runtime.model import RunCreate
from server.host import open_host
from server.settings import Settings


async def test_an_earlier_drive_of_a_run_leased_again_stops_at_once(
    database_url: str, data_dir: Path
) -> None:
    settings = Settings(
        data_dir=data_dir, database_url=database_url, extra_agents=["tests.agents:build_agents"]
    )
    async with open_host(settings, run_worker=False) as host:
        engine, store = host.engine, host.store
        # The sleep is far longer than the test waits: only a stop ends that drive.
        run, _ = await engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 120"))
        first = await store.take_lease(run.run_id, engine.owner, 30.0)
        assert first is not None
        engine.start_drive(run.run_id, first)
        earlier = engine.drives[run.run_id]
        while not any(c.tool == "sleep" for c in await store.list_tool_calls(run.run_id)):
            assert not earlier.task.done()
            await asyncio.sleep(0.02)

        async with store.tx() as tx:  # no renewal came: the lease ran out
            await tx.execute("UPDATE runs SET lease_expires_at = 0 WHERE run_id = ?", (run.run_id,))
        second = await store.take_lease(run.run_id, engine.owner, 30.0)
        assert second == first + 1
        engine.start_drive(run.run_id, second)

        done, _ = await asyncio.wait([earlier.task], timeout=30)
        assert done, "the earlier drive went on beside the new one"
        assert earlier.lease_lost and earlier.task.cancelled()
        assert engine.metrics.value("drives_ended_total", how="lease_lost") == 1
        assert engine.metrics.value("drives_ended_total", how="handed_back") == 0
        assert engine.drives[run.run_id].version == second
        found = await store.get_run(run.run_id)
        assert found is not None and found.state is State.EXECUTING
