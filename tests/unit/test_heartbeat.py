"""The heartbeat stops the drive whose lease it could not renew, and no other: a run
claimed again while the renewal was on its way (its lease released, a decision came)
has a new drive, with a lease of its own, which must go on."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from runtime.commands import Drive
from runtime.worker import Worker
from server.host import open_host
from server.settings import Settings
from tests.unit.conftest import build_run


@pytest.mark.parametrize("replaced", [True, False])
async def test_a_failed_renewal_stops_only_the_drive_it_was_for(
    data_dir: Path, replaced: bool
) -> None:
    settings = Settings(
        data_dir=data_dir, database_url=f"sqlite:///{data_dir}/r.db", lease_seconds=1.0
    )
    async with open_host(settings, run_worker=False) as host:
        engine = host.engine
        first = Drive(asyncio.create_task(asyncio.sleep(60)), 1)
        second = Drive(asyncio.create_task(asyncio.sleep(60)), 2)
        engine.drives["run-x"] = first
        renewed = asyncio.Event()

        async def renew(owner: str, leases: Sequence[object], lease_s: float) -> set[str]:
            if replaced:  # released meanwhile, and claimed again by this process
                engine.drives["run-x"] = second
            renewed.set()
            return set()  # version 1 is not held any more

        engine.store.renew_leases = renew  # type: ignore[method-assign]
        worker = Worker(engine)
        worker.start()
        try:
            await asyncio.wait_for(renewed.wait(), 5)
            await asyncio.sleep(0.05)
            if replaced:
                assert not second.lease_lost and not second.task.done()
            else:
                assert first.lease_lost
                await asyncio.sleep(0)
                assert first.task.cancelled()
        finally:
            engine.drives.clear()
            for drive in (first, second):
                drive.task.cancel()
            await worker.stop(grace_s=0)


async def test_leases_are_renewed_through_the_shutdown_grace(
    database_url: str, data_dir: Path
) -> None:
    """A grace longer than what is left of a lease (the settings allow a lease of 10 s
    and the default grace of 10 s): the drive still finishing keeps its run, which no
    other worker may take over meanwhile."""
    settings = Settings(data_dir=data_dir, database_url=database_url, lease_seconds=1.5)
    async with open_host(settings, run_worker=False) as host:
        engine, store = host.engine, host.engine.store
        run, _ = await store.create_run(build_run(), "h")
        version = await store.take_lease(run.run_id, engine.owner, engine.lease_s)
        assert version is not None
        finishing = Drive(asyncio.create_task(asyncio.sleep(3.0)), version)  # a slow tool
        engine.drives[run.run_id] = finishing
        worker = Worker(engine)
        worker.start()
        stopping = asyncio.create_task(worker.stop(grace_s=5.0))  # SIGTERM
        try:
            await asyncio.sleep(2.5)  # past the lease, within the grace
            assert not finishing.task.done()
            assert await store.take_lease(run.run_id, "another-worker", 30.0) is None
        finally:
            engine.drives.pop(run.run_id, None)
            await stopping
