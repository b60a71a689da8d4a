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
