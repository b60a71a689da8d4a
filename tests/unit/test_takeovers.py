"""Takeovers in a row: one whose drive moves it on starts the count again as it
does, so a long run that meets a failover now and then is never mistaken for one that
kills its workers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from runtime.lifecycle import TERMINAL, State
from runtime.model import RunCreate
from runtime.worker import Worker
from server.host import open_host
from server.settings import Settings


async def test_a_drive_that_checkpoints_a_step_starts_the_count_again(
    database_url: str, data_dir: Path
) -> None:
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents"],
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
    # Taken over once (the claim counted it: tests/unit/test_store.py); back to zero
    # while the same drive still slept, having checkpointed steps, not at its end. (A
    # drive that checkpoints none keeps the count: tests/integration/test_crash_loop.py.)
    assert (True, 0) in seen, seen


async def made_suspect(
    settings: Settings, *requests: RunCreate, expires_in: float | None = None
) -> list[str]:
    """Runs created with no worker about; the first is a suspect: its last worker died
    with it, after two before had (``max_takeovers`` 3), its lease expiring in
    ``expires_in`` seconds (None: expired)."""
    async with open_host(settings, run_worker=False) as host:
        ids = [(await host.engine.create_run(r))[0].run_id for r in requests]
        expires = "0" if expires_in is None else f"{host.store.now_sql} + {expires_in}"
        async with host.store.tx() as tx:
            await tx.execute(
                f"UPDATE runs SET lease_owner = 'w-dead', lease_expires_at = {expires}, "
                "lease_version = 3, takeovers = 2 WHERE run_id = ?",
                (ids[0],),
            )
    return ids


async def suspect_steps_as_others_start(
    settings: Settings,
    ids: list[str],
    later: Sequence[tuple[float, RunCreate]] = (),
    *,
    expire_once_started: bool = False,
) -> list[int]:
    """Drive the runs ``ids`` (the first a suspect), and ``later``'s created at those
    offsets in seconds, to their end; for each of the others, the steps the suspect had
    recorded when it was first seen started. ``expire_once_started``: the suspect's
    lease lapses the moment the second run is seen started (not at a set time, which a
    loaded machine's slow start could pass before any claim)."""
    seen: dict[str, int] = {}
    async with open_host(settings) as host:

        async def expire_suspect() -> None:
            async with host.store.tx() as tx:
                await tx.execute(
                    f"UPDATE runs SET lease_expires_at = {host.store.now_sql} WHERE run_id = ?",
                    (ids[0],),
                )

        async def create_later() -> None:
            start = asyncio.get_running_loop().time()
            for at, request in later:
                await asyncio.sleep(max(0.0, start + at - asyncio.get_running_loop().time()))
                ids.append((await host.engine.create_run(request))[0].run_id)

        ids = list(ids)
        creating = asyncio.create_task(create_later())
        while True:
            steps = await host.store.count_steps(ids[0])
            runs = [await host.store.get_run(run_id) for run_id in list(ids)]
            for run in runs[1:]:
                if run is not None and run.state is not State.PENDING:
                    if expire_once_started and run.run_id == ids[1] and ids[1] not in seen:
                        await expire_suspect()
                    seen.setdefault(run.run_id, steps)
            if creating.done() and all(r is not None and r.state in TERMINAL for r in runs):
                break
            await asyncio.sleep(0.02)
        await creating
        for run in runs:
            assert run is not None and run.state is State.SUCCEEDED, run
    return [seen[run_id] for run_id in ids[1:]]


async def test_a_suspect_has_its_worker_to_itself_until_it_moves_on(
    database_url: str, data_dir: Path
) -> None:
    """Were another run beside it and the worker died, the suspect would be blamed for
    what the other may have done."""
    settings = Settings(
        data_dir=data_dir, database_url=database_url, extra_agents=["tests.agents:build_agents"]
    )
    ids = await made_suspect(
        settings,
        RunCreate(agent_id="swallower", input="think 1.5"),  # a first step of 1.5 s
        RunCreate(agent_id="slow_worker", input="sleep 0.01"),
    )
    # The other waited until the suspect's first step was on the record.
    [steps] = await suspect_steps_as_others_start(settings, ids)
    assert steps >= 1


@pytest.mark.postgres
async def test_busy_workers_stop_taking_runs_for_a_suspect_kept_waiting(
    pg_schema_url: str, data_dir: Path
) -> None:
    """A suspect needs a worker with nothing to drive; one that keeps taking runs as
    slots free may never be. After a lease of waiting, it takes no more until it is,
    however often new runs wake it. (PostgreSQL: an embedded server expires every lease
    as it starts, so no suspect there is held back behind a dead worker's live lease.)"""
    settings = Settings(
        data_dir=data_dir,
        database_url=pg_schema_url,
        extra_agents=["tests.agents:build_agents"],
        lease_seconds=2.0,  # a sweep every 0.5 s
        worker_concurrency=2,
    )
    ids = await made_suspect(
        settings,
        RunCreate(agent_id="swallower", input="think 0.5"),
        RunCreate(agent_id="swallower", input="think 9"),  # keeps the worker busy
        expires_in=3600,  # the dead worker's lease, until the busy run has been claimed
    )
    # A run every 0.2 s, each waking the worker before its sweep would come; the
    # suspect has waited a lease (and been seen to) well before the last ones.
    stream = [(0.2 * i, RunCreate(agent_id="slow_worker", input="sleep 0.01")) for i in range(33)]
    busy, *streamed = await suspect_steps_as_others_start(
        settings, ids, stream, expire_once_started=True
    )
    assert busy == 0  # the suspect could not be claimed yet when it started
    assert streamed[0] == 0  # nor when the first of the stream did
    late = [steps for (at, _), steps in zip(stream, streamed, strict=True) if at >= 5.5]
    assert late and all(steps >= 1 for steps in late), streamed


async def test_a_worker_stopping_mid_claim_gives_the_leases_back(
    database_url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left to lapse, they would count a takeover against each run, as if the worker
    had died: a suspect claimed at that moment would fail for it."""
    settings = Settings(
        data_dir=data_dir, database_url=database_url, extra_agents=["tests.agents:build_agents"]
    )
    [run_id] = await made_suspect(settings, RunCreate(agent_id="slow_worker", input="sleep 0"))
    committed = asyncio.Event()
    async with open_host(settings, run_worker=False) as host:
        store = host.store
        claim_suspect = store.claim_suspect

        async def slow_answer(*args: object, **kwargs: object) -> tuple[str, int] | None:
            got = await claim_suspect(*args, **kwargs)  # type: ignore[arg-type]
            committed.set()
            await asyncio.sleep(0.3)  # the answer on its way back
            return got

        monkeypatch.setattr(store, "claim_suspect", slow_answer)
        worker = Worker(host.engine, concurrency=1)
        worker.start()
        async with asyncio.timeout(30):
            await committed.wait()
        await worker.stop(0.1)
        found = await store.get_run_to_drive(run_id)
        lease = await store.lease_of(run_id)
    assert not host.engine.drives
    # As the dead worker left it: its lease lapsed, two takeovers in a row counted.
    assert lease is not None and lease["lease_owner"] == "w-dead" and lease["remaining_s"] < 0
    assert lease["needs_drive"] == 1 and lease["lease_version"] == 4
    assert found is not None and found.run.state is State.PENDING
    assert (found.takeovers, found.failures) == (2, 0)


async def test_a_claim_that_fails_unexpectedly_is_tried_again(
    database_url: str,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A claim loop that died on it left the worker alive and claiming nothing."""
    settings = Settings(
        data_dir=data_dir, database_url=database_url, extra_agents=["tests.agents:build_agents"]
    )
    async with open_host(settings, run_worker=False) as host:
        claim_runs = host.store.claim_runs
        failures = iter([RuntimeError("a bug of the day")])

        async def flaky(*args: object, **kwargs: object) -> list[tuple[str, int]]:
            for exc in failures:
                raise exc
            return await claim_runs(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(host.store, "claim_runs", flaky)
        worker = Worker(host.engine, concurrency=1, sweep_s=0.05)
        worker.start()
        try:
            with caplog.at_level(logging.ERROR, logger="runtime.worker"):
                run, _ = await host.engine.create_run(
                    RunCreate(agent_id="slow_worker", input="sleep 0")
                )
                final = await host.engine.wait_settled(run.run_id, within_s=30)
        finally:
            await worker.stop(0.1)
    assert final.state is State.SUCCEEDED
    assert any("claiming runs failed" in r.getMessage() for r in caplog.records)
