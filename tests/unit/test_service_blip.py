"""A blip of the runtime's own database while a tool uses it (the artifact it writes, its
user's memory): that is not the tool's failure. The drive is handed back, as after a
crash mid-call, and the next one runs the call again where that is safe; the run does
not fail ``TOOL_FAILED``. A tool's own database failing it is still the tool's failure.

The blip is the one of :mod:`tests.unit.test_outcome_blip`: every pooled PostgreSQL
session ended, or SQLite's write lock held by another connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import psycopg
import pytest
from pydantic import BaseModel

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec
from runtime.lifecycle import State
from runtime.model import Decision, RunCreate
from runtime.planner import PlannerView
from runtime.policy import DefaultPolicy
from runtime.tooling import ToolContext, ToolSpec
from server.host import open_host
from server.settings import Settings
from tests.agents import ScriptPlanner, call
from tests.unit.test_outcome_blip import BLIP_S, Blip, blip, settled_through, shipper_of
from tools.registry import ToolRegistry

__all__ = ["blip"]  # the fixture, used by name


class NoArgs(BaseModel):
    pass


def writer(ran: list[str], blip: Blip, uses: str) -> ToolSpec:
    """Idempotent, no side effect: safe to run again. Its first run meets the blip as it
    writes through the runtime (``uses``: "artifacts" or "memory")."""

    async def write(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
        ran.append(ctx.tool_call_id)
        if len(ran) == 1:
            await blip.begin(BLIP_S)
        if uses == "artifacts":
            art = await ctx.artifacts.put(b"# report", "text/markdown", "report.md")
            return {"artifact_id": art.artifact_id}
        assert ctx.memory is not None
        await ctx.memory.put("last_report", {"v": 1})
        return {"remembered": True}

    return ToolSpec("ship", "1", "Write a report.", NoArgs, write)


def blip_settings(blip: Blip, data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=blip.url,
        default_agent="shipper",
        drive_retry_seconds=0.1,
        # Not waited out: a drive that failed in the blip gives its run back once the
        # database is back, though its first release met the blip too.
        lease_seconds=600.0,
    )


async def settled(blip: Blip, uses: str, data_dir: Path) -> tuple[State, list[str], str]:
    ran: list[str] = []
    settings = blip_settings(blip, data_dir)
    async with open_host(settings, shipper_of(ToolRegistry([writer(ran, blip, uses)]))) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="shipper", input="write"))
        final = await settled_through(host, blip, run.run_id)
        [row] = await host.store.list_tool_calls(run.run_id)
    return final.state, ran, row.status


async def test_an_artifact_store_blip_hands_the_drive_back(blip: Blip, data_dir: Path) -> None:
    state, ran, status = await settled(blip, "artifacts", data_dir)

    assert (state, status) == (State.SUCCEEDED, "succeeded")
    # The same call, run again: at least once more. The blip is a loop of kills, so a
    # drive can get its reads in between two of them and meet the blip again.
    assert len(ran) >= 2 and len(set(ran)) == 1, ran


# SQLite's memory store has a connection of its own, which waits out the blip.
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_memory_store_blip_hands_the_drive_back(blip: Blip, data_dir: Path) -> None:
    state, ran, status = await settled(blip, "memory", data_dir)

    assert (state, status) == (State.SUCCEEDED, "succeeded")
    assert len(ran) >= 2 and len(set(ran)) == 1, ran


async def test_a_tools_own_database_failing_is_the_tools_failure(
    data_dir: Path, tmp_path: Path
) -> None:
    """The same error type, raised by the tool's own connection: ``TOOL_FAILED``."""

    async def query(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
        sqlite3.connect(tmp_path / "sales.db").execute("SELECT * FROM no_such_table")
        return {}

    tools = ToolRegistry([ToolSpec("ship", "1", "Query sales.", NoArgs, query)])
    settings = Settings(data_dir=data_dir, default_agent="shipper")
    async with open_host(settings, shipper_of(tools)) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="shipper", input="query"))
        final = await host.engine.wait_settled(run.run_id, within_s=60)
        [row] = await host.store.list_tool_calls(run.run_id)

    assert final.state is State.FAILED and row.status == "failed", (final, row)
    assert row.error is not None and row.error["code"] == "TOOL_FAILED"


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_write_our_store_refuses_is_the_tools_failure(
    database_url: str, data_dir: Path
) -> None:
    """Not every error of our database is it being away: a write it refuses (here a
    constraint of its own on the memory table) fails the same way every time. The call
    fails once, as the tool's, rather than being handed back until the run gives up."""
    ran: list[str] = []

    async def remember(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
        ran.append(ctx.tool_call_id)
        assert ctx.memory is not None
        await ctx.memory.put("refused", {})
        return {}

    tools = ToolRegistry([ToolSpec("ship", "1", "Remember.", NoArgs, remember)])
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        default_agent="shipper",
        drive_retry_seconds=0.1,
    )
    async with open_host(settings, shipper_of(tools)) as host:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as db:
            await db.execute("ALTER TABLE store ADD CONSTRAINT keeps CHECK (key <> 'refused')")
        run, _ = await host.engine.create_run(RunCreate(agent_id="shipper", input="remember"))
        final = await host.engine.wait_settled(run.run_id, within_s=60)
        [row] = await host.store.list_tool_calls(run.run_id)

    assert final.state is State.FAILED and len(ran) == 1, (final, ran)
    assert row.error is not None and row.error["code"] == "TOOL_FAILED", row
    assert "keeps" in row.error["message"]


async def test_a_compensation_that_meets_a_blip_is_run_again_not_failed(
    blip: Blip, data_dir: Path
) -> None:
    """A cancel's compensation writes its receipt (an artifact) as the database goes
    away: not COMPENSATION_FAILED for a human, but the cancel's drive handed back, and
    the next one compensates."""
    shipped, held = asyncio.Event(), asyncio.Event()
    undone: list[str] = []

    async def ship(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
        shipped.set()
        return {"shipped": True}

    async def unship(args: NoArgs, output: object, ctx: ToolContext) -> None:
        undone.append(ctx.tool_call_id)
        if len(undone) == 1:
            await blip.begin(BLIP_S)
        await ctx.artifacts.put(b"refund", "text/plain", "receipt.txt")

    async def hold(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
        await held.wait()  # until the cancel cuts it off
        return {}

    def script(view: PlannerView) -> Decision:
        return call("hold") if view.observations else call("ship")

    tools = ToolRegistry(
        [
            ToolSpec("ship", "1", "Ship.", NoArgs, ship, side_effect=True, compensate=unship),
            ToolSpec("hold", "1", "Hold.", NoArgs, hold),
        ]
    )
    graph = build_run_graph(ScriptPlanner(script), tools, DefaultPolicy())
    settings = blip_settings(blip, data_dir)
    agents = {"shipper": AgentSpec("shipper", "ships", graph, tools)}
    async with open_host(settings, agents) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="shipper", input="ship"))
        await asyncio.wait_for(shipped.wait(), 30)
        await host.engine.cancel(run.run_id, "stop", compensate=True, wait_s=0)
        final = await settled_through(host, blip, run.run_id)
        events = await host.store.list_events(run.run_id)

    assert final.outcome is not None and final.outcome.code == "RUN_CANCELLED", final.outcome
    # The same compensation, again (more than once if a retried drive met the blip too).
    assert len(undone) >= 2 and len(set(undone)) == 1, undone
    assert final.outcome.compensations == [undone[0]], final.outcome
    assert not [e for e in events if e.data.get("code") == "COMPENSATION_FAILED"], events
