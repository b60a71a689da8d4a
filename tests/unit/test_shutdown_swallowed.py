"""A drive whose shutdown cancel is swallowed (by a planner, as a user's cancel can be):
it stopped neither at its next node nor by the end of the shutdown, ran that node's
tool calls past the grace, beside the process taking the run over (a probe saw one
call run in two processes at once), and held the process's exit for as long."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from pydantic import BaseModel

from runtime import engine as engine_module
from runtime.lifecycle import State
from runtime.model import RunCreate
from runtime.tooling import ToolContext, ToolSpec
from server.host import open_host
from server.settings import Settings
from tests.agents import counter_lines
from tests.unit.test_outcome_blip import shipper_of
from tools.registry import ToolRegistry


async def test_a_swallowed_shutdown_cancel_stops_the_drive_at_its_next_node(
    database_url: str, data_dir: Path
) -> None:
    settings = Settings(
        data_dir=data_dir, database_url=database_url, extra_agents=["tests.agents:build_agents"]
    )
    async with open_host(settings, run_worker=False) as host:
        engine = host.engine
        run, _ = await engine.create_run(RunCreate(agent_id="swallower", input="think 3"))
        version = await engine.store.take_lease(run.run_id, engine.owner, engine.lease_s)
        assert version is not None
        engine.start_drive(run.run_id, version)
        async with asyncio.timeout(30):  # until the planner is thinking
            while True:
                planning = await engine.store.get_run(run.run_id)
                if planning is not None and planning.state is State.PLANNING:
                    break
                await asyncio.sleep(0.02)
        drive = engine.drives[run.run_id].task

        await engine.shutdown(grace_s=0.2)  # lands in the planner's sleep, swallowed

        assert drive.done()  # not left behind the shutdown
        assert counter_lines(data_dir) == []  # the next node's call did not run
        lease = await engine.store.lease_of(run.run_id)
        assert lease is not None and lease["lease_owner"] is None  # handed back

    async with open_host(settings) as host:  # the next process takes it from there
        final = await host.engine.wait_settled(run.run_id)
    assert final.state is State.SUCCEEDED, final.outcome
    assert len(counter_lines(data_dir)) == 1


class NoArgs(BaseModel):
    pass


async def test_a_drive_that_will_not_stop_does_not_hold_the_shutdown(
    database_url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past UNWIND_S the shutdown returns without it: its lease lapses instead."""
    monkeypatch.setattr(engine_module, "UNWIND_S", 0.3)
    shipping = asyncio.Event()

    async def deaf_ship(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
        shipping.set()
        for _ in range(30):  # 3 s, deaf to every cancel
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.1)
        return {}

    agents = shipper_of(ToolRegistry([ToolSpec("ship", "1", "Ship.", NoArgs, deaf_ship)]))
    settings = Settings(data_dir=data_dir, database_url=database_url, default_agent="shipper")
    async with open_host(settings, agents, run_worker=False) as host:
        engine = host.engine
        run, _ = await engine.create_run(RunCreate(agent_id="shipper", input="x"))
        version = await engine.store.take_lease(run.run_id, engine.owner, engine.lease_s)
        assert version is not None
        engine.start_drive(run.run_id, version)
        drive = engine.drives[run.run_id].task
        await asyncio.wait_for(shipping.wait(), 30)

        await engine.shutdown(grace_s=0.1)

        assert not drive.done()
        await asyncio.wait([drive], timeout=30)
