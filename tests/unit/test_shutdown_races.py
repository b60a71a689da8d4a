"""Cancels that meet a shutdown: the worker's stop now begins as the server's shutdown
does, while its HTTP side still serves requests (a cancel among them). Found by review."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from runtime import release as release_module
from runtime.lifecycle import State
from runtime.model import RunCreate
from runtime.store.base import RunStore
from server.host import open_host
from server.settings import Settings


def settings_of(database_url: str, data_dir: Path) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents"],
        shutdown_grace_s=0.5,
    )


async def test_a_cancel_whose_lease_comes_after_the_stop_gives_it_back(
    database_url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its drive started after the worker had stopped: unwatched, its lease never
    renewed, outside any grace."""
    settings = settings_of(database_url, data_dir)
    async with open_host(settings) as host:
        engine, worker = host.engine, host.worker
        assert worker is not None
        run, _ = await engine.create_run(RunCreate(agent_id="second_guesser", input="x"))
        async with asyncio.timeout(30):  # parked, its drive gone
            while True:
                parked = await engine.store.get_run(run.run_id)
                if (
                    parked
                    and parked.state is State.WAITING_HUMAN
                    and run.run_id not in engine.drives
                ):
                    break
                await asyncio.sleep(0.05)
        take_lease = engine.store.take_lease
        asked = asyncio.Event()

        async def slow_take_lease(*args: Any, **kwargs: Any) -> int | None:
            asked.set()
            await asyncio.sleep(0.5)  # a busy database's round trip
            return await take_lease(*args, **kwargs)

        monkeypatch.setattr(engine.store, "take_lease", slow_take_lease)
        cancelling = asyncio.create_task(engine.cancel(run.run_id, "stop", wait_s=0.1))
        await asyncio.wait_for(asked.wait(), 30)
        await worker.stop(settings.shutdown_grace_s)  # SIGTERM's, as the lease is taken

        await cancelling
        assert engine.drives == {}
        lease = await engine.store.lease_of(run.run_id)
        assert lease is not None and lease["lease_owner"] is None
        assert lease["needs_drive"]  # the cancel is left to the next process


async def test_a_cancel_notice_during_a_hand_back_does_not_keep_the_lease(
    database_url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It landed in the hand-back's flush: the release after it never ran, and the run
    waited a lease, then counted a takeover."""
    flushing = asyncio.Event()
    flush_quietly = release_module.flush_quietly

    async def slow_flush(store: RunStore) -> None:
        flushing.set()
        await asyncio.sleep(0.3)  # a few ms in life
        await flush_quietly(store)

    async with open_host(settings_of(database_url, data_dir), run_worker=False) as host:
        engine = host.engine
        run, _ = await engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 60"))
        version = await engine.store.take_lease(run.run_id, engine.owner, engine.lease_s)
        assert version is not None
        engine.start_drive(run.run_id, version)
        async with asyncio.timeout(30):  # in its tool
            while True:
                if await engine.store.list_tool_calls(run.run_id):
                    break
                await asyncio.sleep(0.02)
        monkeypatch.setattr("runtime.engine.flush_quietly", slow_flush)
        shutting = asyncio.create_task(engine.shutdown(grace_s=0.1))
        await asyncio.wait_for(flushing.wait(), 30)
        assert await engine.store.request_cancel(run.run_id, "stop", False, None)
        engine.on_cancel_notice(run.run_id)
        await shutting

        lease = await engine.store.lease_of(run.run_id)
        assert lease is not None and lease["lease_owner"] is None
