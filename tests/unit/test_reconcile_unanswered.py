"""A call left running by a drive that stopped, whose tool never answers what became of
it: each drive that asks fails within the tool's timeout and is retried; when they
have all failed, the run ends saying the call's outcome is unknown (a human's to
find out), not that the database could not persist its state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runtime.errors import Code
from runtime.lifecycle import State
from runtime.model import RunCreate, ToolCall
from server.host import open_host
from server.settings import Settings
from tests.agents import transfer_lines


def settings_for(database_url: str, data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents"],
        max_drive_failures=2,
        drive_retry_seconds=0.05,
        shutdown_grace_s=0,  # the first host hands the run back mid-transfer
    )


async def left_mid_transfer(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> str:
    """A run whose host stopped while its transfer ran, the call left running; the
    host opened next has that tool's transfer time out fast and its reconcile never
    answer."""
    async with open_host(settings) as host:
        # The effect lands as the transfer ends, which it does not before the shutdown.
        run, _ = await host.engine.create_run(RunCreate(agent_id="transferrer", input="last 60"))
        async with asyncio.timeout(30):  # a bound on a hang, not a speed
            while True:
                if await host.store.list_tool_calls(run.run_id):
                    break
                await asyncio.sleep(0.02)
    # The tools are built as a host opens.
    monkeypatch.setenv("TEST_TRANSFER_TIMEOUT_S", "0.2")
    monkeypatch.setenv("TEST_RECONCILE_S", "3600")
    return run.run_id


async def test_a_reconcile_that_never_answers_fails_the_run_with_the_call_unknown(
    database_url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(database_url, data_dir)
    run_id = await left_mid_transfer(settings, monkeypatch)
    [left] = await _calls(settings, run_id)
    assert left.status == "running" and transfer_lines(data_dir) == []

    async with open_host(settings) as host:
        final = await host.engine.wait_settled(run_id, within_s=60)
        [call] = await host.store.list_tool_calls(run_id)
        events = await host.store.list_events(run_id)

    assert final.state is State.FAILED and final.outcome is not None
    assert final.outcome.code is Code.TOOL_OUTCOME_UNKNOWN, final.outcome
    assert "did not answer within 0.2s" in final.outcome.message, final.outcome
    # Never run again, never said to have not happened: its effect is for a human to
    # find out, and the outcome lists it among those that may have happened.
    assert transfer_lines(data_dir) == [] and call.attempts == 1
    assert call.status == "unknown" and call.error is not None
    assert call.error["code"] == Code.TOOL_OUTCOME_UNKNOWN, call.error
    assert final.outcome.side_effects == [call.tool_call_id]
    [failed] = [e.data for e in events if e.type == "error"]
    assert failed["code"] == Code.TOOL_OUTCOME_UNKNOWN and failed["recovery"] == "human"
    assert failed["tool_call_id"] == call.tool_call_id, failed


async def _calls(settings: Settings, run_id: str) -> list[ToolCall]:
    async with open_host(settings, run_worker=False) as host:
        return await host.store.list_tool_calls(run_id)
