"""An outcome the engine kept (its write met an outage past the lease) meets the run's
ending before the executor could record it: a cancel asking for compensation. The
ending records it first, so the effect that surely happened is ``succeeded`` and is
compensated, not closed as one that may have happened and left standing.

The blip is the one of :mod:`tests.unit.test_outcome_blip`. The engine's case runs on
SQLite alone: there the outage (another connection holding the write lock) fails every
try of the write surely, where on PostgreSQL (sessions ended every 15 ms) a retry slips
through between two rounds now and then, and the drive records the outcome itself.
"""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from runtime.lifecycle import State
from runtime.model import RunCreate
from runtime.recording import Recording
from runtime.store.base import RunStore
from runtime.tooling import ToolContext
from server.host import open_host
from server.settings import Settings
from tests.unit.conftest import MakeRun
from tests.unit.test_outcome_blip import (
    Blip,
    blip,
    execute,
    left_unrecorded,
    ship_tool,
    shipper_of,
    store,
)
from tools.registry import ToolRegistry

__all__ = ["blip", "store"]  # fixtures

OUTAGE_S = 2.5
LEASE_S = 1.0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_cancel_records_the_kept_outcome_and_compensates_it(
    blip: Blip, data_dir: Path
) -> None:
    shipped: list[str] = []
    recalled: list[str] = []
    ship = ship_tool(shipped, blip, OUTAGE_S)

    async def recall(args: BaseModel, output: Any, ctx: ToolContext) -> None:
        recalled.append(ctx.idempotency_key)

    tools = ToolRegistry([replace(ship, compensate=recall)])
    agents = shipper_of(tools)
    settings = Settings(
        data_dir=data_dir,
        database_url=blip.url,
        default_agent="shipper",
        lease_seconds=LEASE_S,
        # The failed drive's successor comes after the cancel: it is the cancel's.
        drive_retry_seconds=OUTAGE_S * 4,
    )
    async with open_host(settings, agents) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="shipper", input="ship"))
        async with asyncio.timeout(30):
            while True:
                if len(host.engine.unrecorded) == 1:  # the drive gave up on the write
                    break
                await asyncio.sleep(0.05)
        await blip.over(host.store)
        [left] = await host.store.list_tool_calls(run.run_id)
        assert left.status == "running", left  # the outcome is the engine's alone

        async with asyncio.timeout(60):
            while True:
                try:
                    ended = await host.engine.cancel(
                        run.run_id, "recall it", compensate=True, wait_s=60
                    )
                    break
                except (psycopg.OperationalError, sqlite3.OperationalError):
                    await asyncio.sleep(0.1)  # the outage's tail, on the test's own write
        [row] = await host.store.list_tool_calls(run.run_id)
        kept = len(host.engine.unrecorded)

    assert ended.state is State.FAILED and ended.outcome is not None
    assert ended.outcome.code == "RUN_CANCELLED", ended.outcome
    assert row.status == "succeeded" and row.output == {"shipped": "box"}, row
    assert row.compensated, row
    assert shipped == recalled and len(shipped) == 1
    assert ended.outcome.compensations == [row.tool_call_id], ended.outcome
    assert kept == 0


async def test_a_kept_outcome_is_let_go_once_another_drive_has_ruled_on_the_call(
    store: RunStore, blip: Blip, make_run: MakeRun
) -> None:
    """Another process's drive, not knowing it, closed the call as unknown: the ledger's
    word stands, and the engine lets the outcome go rather than keep it for ever."""
    run = await make_run(store)
    shipped: list[str] = []
    spec, recording = await left_unrecorded(store, blip, run.run_id, shipped)
    ruled = await execute(store, run.run_id, spec, Recording())
    assert ruled.status == "unknown" and len(recording.kept) == 1

    row = await execute(store, run.run_id, spec, recording)

    assert row == ruled and len(shipped) == 1
    assert len(recording.kept) == 0
