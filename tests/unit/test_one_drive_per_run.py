"""A process drives a run once at a time: leased again while an earlier drive of its
own still runs it (that drive's lease ran out unrenewed: its event loop was blocked,
or the database away, for a lease), the earlier drive stops at once, as one whose
lease another worker took. On SQLite nothing else would stop it writing checkpoints
beside the new drive until its next store write."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from runtime.commands import Drive
from runtime.errors import Code
from runtime.lifecycle import State
from runtime.model import RunCreate
from runtime.worker import Worker
from server.host import Host, open_host
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


async def test_a_worker_that_leases_its_own_lapsed_run_again_drives_it_at_once(
    database_url: str, data_dir: Path
) -> None:
    """The worker's claim loop: a run whose lease lapsed under this process's own drive
    (its renewals could not reach the database for a lease) is driven by the new lease
    straight away, not left idle for another lease while the old drive stops."""
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents"],
        lease_seconds=30.0,
    )
    async with open_host(settings, run_worker=False) as host:
        engine, store = host.engine, host.store

        async def unreachable(owner: str, leases: Sequence[object], lease_s: float) -> set[str]:
            raise psycopg.OperationalError("connection refused")

        store.renew_leases = unreachable  # type: ignore[method-assign]
        worker = Worker(engine)
        worker.start()
        try:
            run, _ = await engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 120"))
            async with asyncio.timeout(30):
                # A row in the database: no event to wait on.
                while not any(c.tool == "sleep" for c in await store.list_tool_calls(run.run_id)):  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            earlier = engine.drives[run.run_id]

            async with store.tx() as tx:  # a lease without a renewal: it ran out
                await tx.execute(
                    "UPDATE runs SET lease_expires_at = 0 WHERE run_id = ?", (run.run_id,)
                )
            engine.wake()
            # The earlier drive sleeps for minutes and writes nothing meanwhile: only the
            # claim loop starting the new lease's drive ends it.
            async with asyncio.timeout(20):
                while engine.drives[run.run_id] is earlier:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                await asyncio.wait({earlier.task})
            assert earlier.lease_lost and earlier.task.cancelled()
            now = engine.drives[run.run_id]
            assert now.version == earlier.version + 1 and not now.task.done()
            found = await store.get_run(run.run_id)
            assert found is not None and found.state is State.EXECUTING
        finally:
            await worker.stop(grace_s=0)


@dataclass
class DrivenAgain:
    host: Host
    run_id: str
    earlier: Drive
    """A stand-in for the run's earlier drive, past its work: it ends on ``released``."""
    released: asyncio.Event


async def lease_again(host: Host, run_id: str, *, lapsed: bool = False) -> None:
    """Lease the run again (its lease ``lapsed`` first) and start the lease's drive."""
    if lapsed:
        async with host.store.tx() as tx:
            await tx.execute("UPDATE runs SET lease_expires_at = 0 WHERE run_id = ?", (run_id,))
    version = await host.store.take_lease(run_id, host.engine.owner, 30.0)
    assert version is not None
    host.engine.start_drive(run_id, version)


@asynccontextmanager
async def driven_again(database_url: str, data_dir: Path) -> AsyncIterator[DrivenAgain]:
    """A new run leased and driven while an earlier drive of it has not ended (released,
    with a decision to act on, say, and claimed again before its task was done)."""
    settings = Settings(
        data_dir=data_dir, database_url=database_url, extra_agents=["tests.agents:build_agents"]
    )
    async with open_host(settings, run_worker=False) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 0"))
        released = asyncio.Event()

        async def releasing() -> None:
            await released.wait()

        earlier = Drive(asyncio.create_task(releasing()), 7, started=True, ending=True)
        host.engine.drives[run.run_id] = earlier
        await lease_again(host, run.run_id)
        try:
            yield DrivenAgain(host, run.run_id, earlier, released)
        finally:
            earlier.task.cancel()


async def test_a_drive_past_its_work_finishes_before_the_next_drive_of_its_run_starts(
    database_url: str, data_dir: Path
) -> None:
    """The earlier drive, past its work, is not stopped as if its lease were lost, and the
    new one begins once it has ended."""
    async with driven_again(database_url, data_dir) as again:
        engine, store = again.host.engine, again.host.store
        await asyncio.sleep(0.3)
        assert not again.earlier.lease_lost and not again.earlier.task.done()
        found = await store.get_run(again.run_id)
        assert found is not None and found.state is State.PENDING  # not begun
        again.released.set()
        settled = await engine.wait_settled(again.run_id, within_s=30)
        assert settled.state is State.SUCCEEDED
        assert engine.metrics.value("drives_ended_total", how="lease_lost") == 0


async def test_a_drive_stopped_while_it_waits_for_the_earlier_one_gives_its_lease_back(
    database_url: str, data_dir: Path
) -> None:
    """A shutdown while the new drive waits for the earlier one to end: the new lease is
    handed back at once, not left to lapse (which would count a takeover)."""
    async with driven_again(database_url, data_dir) as again:
        engine = again.host.engine
        await asyncio.sleep(0.1)  # waiting for the earlier drive
        await engine.shutdown()
        lease = await again.host.store.lease_of(again.run_id)
        # The earlier drive is not left running past the shutdown either.
        assert again.earlier.task.cancelled()
    assert lease is not None and lease["lease_owner"] is None and lease["needs_drive"] == 1
    assert engine.metrics.value("drives_ended_total", how="handed_back") == 1


async def test_a_cancel_while_the_new_drive_waits_is_carried_out_once_it_begins(
    database_url: str, data_dir: Path
) -> None:
    """A cancel notice does not stop a drive still waiting for the earlier one (it would
    end the run beside it, or leave its lease to lapse): the drive reads the cancel when
    it begins, and carries it out."""
    async with driven_again(database_url, data_dir) as again:
        engine, store = again.host.engine, again.host.store
        waiting = engine.drives[again.run_id]
        asked = await engine.cancel(again.run_id, "not needed", wait_s=0.3)
        assert asked.state is State.PENDING and not waiting.task.done()
        again.released.set()
        settled = await engine.wait_settled(again.run_id, within_s=30)
        assert settled.state is State.FAILED
        assert settled.outcome is not None and settled.outcome.code is Code.RUN_CANCELLED
        lease = await store.lease_of(again.run_id)
        assert lease is not None and lease["lease_owner"] is None


async def test_a_drive_waits_for_every_earlier_drive_of_its_run_still_unwinding(
    database_url: str, data_dir: Path
) -> None:
    """A, still unwinding; B, waiting for A, loses its lease too; C must wait for A as
    well, not only for B, which stops at once."""
    async with driven_again(database_url, data_dir) as again:
        engine, store = again.host.engine, again.host.store
        await asyncio.sleep(0.1)
        await lease_again(again.host, again.run_id, lapsed=True)  # C
        await asyncio.sleep(0.3)
        found = await store.get_run(again.run_id)
        assert found is not None and found.state is State.PENDING  # C has not begun
        again.released.set()
        settled = await engine.wait_settled(again.run_id, within_s=30)
        assert settled.state is State.SUCCEEDED
        assert engine.metrics.value("drives_ended_total", how="lease_lost") == 1  # B


async def test_an_earlier_drive_still_unwinding_takes_a_worker_slot(
    database_url: str, data_dir: Path
) -> None:
    """A worker of two slots, one run's new drive waiting for its earlier drive: the
    earlier drive still runs, so no other run is claimed until it ends."""
    async with driven_again(database_url, data_dir) as again:
        engine, store = again.host.engine, again.host.store
        other, _ = await engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 0"))
        worker = Worker(engine, concurrency=2)
        worker.start()
        try:
            await asyncio.sleep(0.5)
            found = await store.get_run(other.run_id)
            assert found is not None and found.state is State.PENDING  # not claimed
            again.released.set()
            for run_id in (again.run_id, other.run_id):
                settled = await engine.wait_settled(run_id, within_s=30)
                assert settled.state is State.SUCCEEDED
        finally:
            await worker.stop(grace_s=0)
