"""``runtime.recording.with_retries``: a write tried again through a blip, up to a
bound. The write stands in for the database here (the blip tests drive real ones):
what is tested is where the retries stop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel, ConfigDict

from runtime import ledger
from runtime.lifecycle import State
from runtime.model import RunCreate
from runtime.recording import WriteUnanswered, with_retries
from runtime.tooling import ToolContext, ToolSpec
from server.host import open_host
from server.settings import Settings
from tests.unit.test_outcome_blip import shipper_of
from tools.registry import ToolRegistry


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Stuck:
    """A write that fails at once, then hangs as one waiting for a pooled connection
    does (psycopg_pool's own timeout is 30 s)."""

    def __init__(self) -> None:
        self.tries = 0

    async def __call__(self) -> str:
        self.tries += 1
        if self.tries == 1:
            raise psycopg.OperationalError("the connection was closed")
        await asyncio.sleep(3600)
        return "written"


async def test_a_retry_waiting_on_the_database_ends_at_the_bound() -> None:
    write = Stuck()
    bound = time.monotonic() + 0.3

    async with asyncio.timeout(10):  # the pool's wait, had the retry not been bounded
        # Not a TimeoutError: out of a graph, that is the run's own time budget running out.
        with pytest.raises(WriteUnanswered):
            await with_retries(write, lambda: bound, "a test's outcome")

    assert write.tries == 2


async def test_a_retry_that_succeeds_within_the_bound_is_its_result() -> None:
    tries = 0

    async def write() -> str:
        nonlocal tries
        tries += 1
        if tries < 3:
            raise psycopg.OperationalError("the connection was closed")
        return "written"

    assert await with_retries(write, lambda: time.monotonic() + 5, "a test's outcome") == "written"
    assert tries == 3


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_drive_whose_retry_meets_its_bound_is_retried_not_timed_out(
    data_dir: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a drive: the bound's TimeoutError, out of the graph, read as the run's
    own time budget running out, failed the run RUN_BUDGET_EXCEEDED and closed the
    call that had run as cancelled. The drive is retried instead, and the next one
    records the outcome its engine kept. (The outcome's write stands in for the
    database: it fails once, then hangs as a wait for a pooled connection does.)"""
    shipped: list[str] = []

    async def ship(args: NoArgs, ctx: ToolContext) -> dict[str, object]:
        shipped.append(ctx.idempotency_key)
        return {"shipped": "box"}

    tools = ToolRegistry(
        [ToolSpec("ship", "1", "Ship a box.", NoArgs, ship, side_effect=True, idempotent=False)]
    )
    stuck = Stuck()
    real = ledger._finish

    async def finish_once_stuck(*args: Any, **kwargs: Any) -> Any:
        if stuck.tries < 2:
            await stuck()
        return await real(*args, **kwargs)

    monkeypatch.setattr(ledger, "_finish", finish_once_stuck)
    agents = shipper_of(tools)
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        default_agent="shipper",
        lease_seconds=1.0,  # the retries' bound: the lease as of the first failure
        drive_retry_seconds=0.1,
    )
    async with open_host(settings, agents) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="shipper", input="ship"))
        ended = await host.engine.wait_settled(run.run_id, within_s=30)
        [row] = await host.store.list_tool_calls(run.run_id)

    assert ended.state is State.SUCCEEDED, ended.outcome
    assert row.status == "succeeded" and row.output == {"shipped": "box"}, row
    assert len(shipped) == 1 and stuck.tries == 2
