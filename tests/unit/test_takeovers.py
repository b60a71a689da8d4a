"""Takeovers in a row: a run that keeps losing its worker is counted, and one whose
drive moves it on starts the count again (the heartbeat says so), so a long run that
meets a failover now and then is never mistaken for one that kills its workers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from runtime.lifecycle import TERMINAL, State
from runtime.model import RunCreate
from server.host import open_host
from server.settings import Settings


async def test_a_drive_that_checkpoints_a_step_starts_the_count_again(
    database_url: str, data_dir: Path
) -> None:
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents"],
        lease_seconds=0.6,  # renewed every 0.2 s
        max_takeovers=2,
    )
    async with open_host(settings, run_worker=False) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 2"))
        # Its worker died before the run's first checkpoint: a lease run out, unreleased.
        async with host.store.tx() as tx:
            await tx.execute(
                "UPDATE runs SET lease_owner = 'w-dead', lease_expires_at = 0, "
                "lease_version = 1, takeovers = 0 WHERE run_id = ?",
                (run.run_id,),
            )

    seen: list[tuple[bool, int]] = []  # (the sleep has started, takeovers in a row)
    async with open_host(settings) as host:
        while True:
            found = await host.store.get_run_to_drive(run.run_id)
            assert found is not None
            if found.run.state in TERMINAL:
                break
            calls = await host.store.list_tool_calls(run.run_id)
            seen.append((any(c.tool == "sleep" for c in calls), found.takeovers))
            await asyncio.sleep(0.05)
        events = await host.store.list_events(run.run_id)

    assert found.run.state is State.SUCCEEDED, found.run.outcome
    lost = [e.data for e in events if e.type == "error"]
    assert [(e["code"], e["worker"]) for e in lost] == [("WORKER_LOST", "w-dead")]
    # Taken over once; renewed by a drive that had checkpointed steps since, while the
    # same drive still slept: back to zero, not at its end.
    assert max(n for _, n in seen) == 1, seen
    assert (True, 0) in seen, seen
