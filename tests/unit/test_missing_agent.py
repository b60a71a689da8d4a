"""A run of an agent the process that leases it does not have (a fleet mid-deploy, a
server restarted without an agent module): handed back for a process that has it,
never failed with the lookup's KeyError (a probe saw INTERNAL_ERROR, and a side
effect's run ended for good)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from runtime.errors import RuntimeProblem
from runtime.lifecycle import State
from runtime.model import Run, RunCreate, RunOptions
from runtime.store.base import DriveStart, RunStore
from server.host import open_host
from server.settings import Settings


async def run_of_an_agent_then_without_it(
    database_url: str, data_dir: Path
) -> tuple[Run, Settings, Settings]:
    """A run of agent slow_worker, created by a process that has it, and the settings
    of one that has it and of one that does not."""
    with_agent = Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents"],
        lease_seconds=1.0,
    )
    async with open_host(with_agent, run_worker=False) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 0"))
    return run, with_agent, with_agent.model_copy(update={"extra_agents": []})


async def test_a_worker_leaves_the_runs_of_an_agent_it_lacks_to_one_with_it(
    database_url: str, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its claims skip them: it leased them only to hand them back, each a lease later
    (a fleet mid-deploy), and took the drainer's turn for their suspects. It says at
    its start which runs it leaves (where no process has the agent, nothing else does)."""
    run, with_agent, without = await run_of_an_agent_then_without_it(database_url, data_dir)

    with caplog.at_level(logging.WARNING, logger="runtime.worker"):
        async with open_host(without) as host:
            # A later run it can drive: the older one comes first in every claim.
            own, _ = await host.engine.create_run(RunCreate(input="hello"))
            driven = await host.engine.wait_settled(own.run_id)
            lease = await host.store.lease_of(run.run_id)
            events = await host.store.list_events(run.run_id)
            metrics = host.engine.metrics

    assert driven.state is not State.PENDING
    assert lease is not None and lease["lease_version"] == 0 and lease["lease_owner"] is None
    assert [e.type.value for e in events] == ["state"]  # its creation: nothing handed on
    assert metrics.value("drives_ended_total", how="no_agent") == 0
    said = [r.getMessage() for r in caplog.records if "slow_worker" in r.getMessage()]
    assert said and "1 run(s) of agent slow_worker wait" in said[0]

    async with open_host(with_agent) as host:
        final = await host.engine.wait_settled(run.run_id)
    assert final.state is State.SUCCEEDED, final.outcome


async def test_a_worker_without_the_agent_carries_out_a_cancel_asked_elsewhere(
    database_url: str, data_dir: Path
) -> None:
    """A cancel asked through a process that drives nothing (an API server without a
    worker): the run is claimed for it by a worker without its agent too, or a fleet
    that retired the agent would keep it active for ever."""
    run, _, without = await run_of_an_agent_then_without_it(database_url, data_dir)
    async with open_host(without, run_worker=False) as host:
        assert await host.store.request_cancel(run.run_id, "agent retired", False)

    async with open_host(without) as host, asyncio.timeout(60):  # a bound on a hang
        ended = await host.engine.wait_settled(run.run_id)

    assert ended.state is State.FAILED and ended.outcome is not None
    assert ended.outcome.code == "RUN_CANCELLED"


async def test_a_claim_of_a_run_its_process_cannot_drive_hands_it_on(
    database_url: str, data_dir: Path
) -> None:
    """Should a lease of such a run come about all the same (a claim of every agent),
    the run is handed back for a process that has its agent, never failed by the
    agent's lookup (a probe saw INTERNAL_ERROR, and a side effect's run ended for good)."""
    run, with_agent, without = await run_of_an_agent_then_without_it(database_url, data_dir)

    async with open_host(without, run_worker=False) as host:
        for _ in range(2):
            version = await host.store.take_lease(run.run_id, host.engine.owner, 30.0)
            assert version is not None
            host.engine.start_drive(run.run_id, version)
            await host.engine.drives[run.run_id].task
        found = await host.store.get_run_to_drive(run.run_id)
        events = await host.store.list_events(run.run_id)
        handed = host.engine.metrics.value("drives_ended_total", how="no_agent")

    assert handed == 2
    assert found is not None and found.run.state is State.PENDING and found.failures == 0
    errors = [e.data for e in events if e.type == "error"]
    assert [e["code"] for e in errors] == ["AGENT_NOT_FOUND"]  # once, however often handed
    assert "slow_worker" in errors[0]["message"] and errors[0]["recovery"] == "retry"

    async with open_host(with_agent) as host:
        final = await host.engine.wait_settled(run.run_id)
    assert final.state is State.SUCCEEDED, final.outcome


async def test_a_retried_create_finds_its_run_where_the_agent_is_missing(
    database_url: str, data_dir: Path
) -> None:
    """A fleet mid-deploy: a create answered by a server with the agent, its retry
    (the answer was lost) landing on one without it. The retry gets the run, not a
    422 that tells the client no run was made; only a new run needs the agent."""
    with_agent = Settings(
        data_dir=data_dir, database_url=database_url, extra_agents=["tests.agents:build_agents"]
    )

    def create(key: str) -> RunCreate:
        options = RunOptions(idempotency_key=key)
        return RunCreate(agent_id="slow_worker", input="sleep 0", options=options)

    async with open_host(with_agent, run_worker=False) as host:
        made, _ = await host.engine.create_run(create("retried"))

    async with open_host(with_agent.model_copy(update={"extra_agents": []})) as host:
        again, created = await host.engine.create_run(create("retried"))
        with pytest.raises(RuntimeProblem) as new:
            await host.engine.create_run(create("another"))
        runs, _ = await host.store.list_runs()
    assert [r.run_id for r in runs] == [made.run_id]  # the refusal made nothing

    assert not created and again.run_id == made.run_id
    assert new.value.code == "AGENT_NOT_FOUND"


async def test_a_run_whose_agent_is_gone_can_still_be_cancelled(
    database_url: str, data_dir: Path
) -> None:
    """By a process without its agent (an embedded server has no other): nothing of
    this run needs the agent's tools; otherwise it would count against its tenant's
    active runs for ever."""
    run, _, without = await run_of_an_agent_then_without_it(database_url, data_dir)

    async with open_host(without) as host:
        ended = await host.engine.cancel(run.run_id, "agent retired", wait_s=30)

    assert ended.state is State.FAILED and ended.outcome is not None
    assert ended.outcome.code == "RUN_CANCELLED"


async def test_a_cancel_that_lands_as_the_run_is_handed_on_ends_it(
    database_url: str, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drive's cancel path ended it with the tools of the agent it lacks: a
    KeyError, the drive counted as failed (a review found)."""
    run, _, without = await run_of_an_agent_then_without_it(database_url, data_dir)
    handing = asyncio.Event()

    async with open_host(without) as host:
        engine = host.engine
        hand_on = engine._hand_on

        async def slow_hand_on(store: RunStore, found: DriveStart) -> float:
            handing.set()
            await asyncio.sleep(30)  # cut short by the cancel's notice
            return await hand_on(store, found)

        monkeypatch.setattr(engine, "_hand_on", slow_hand_on)
        [(run_id, version)] = await host.store.claim_runs(engine.owner, 1, 30.0)  # any agent
        engine.start_drive(run_id, version)
        async with asyncio.timeout(30):  # a bound on a hang, not a speed
            await handing.wait()
        ended = await engine.cancel(run.run_id, "agent retired", wait_s=30)
        found = await host.store.get_run_to_drive(run.run_id)

    assert ended.state is State.FAILED and ended.outcome is not None
    assert ended.outcome.code == "RUN_CANCELLED"
    assert found is not None and found.failures == 0
    assert engine.metrics.value("drives_ended_total", how="failed") == 0


async def test_the_checkpoint_of_a_run_whose_agent_is_gone_is_still_read(
    database_url: str, data_dir: Path
) -> None:
    """It is part of the run's record: a server without the agent (retired since, or
    another server's) answered GET /runs/{id}/checkpoint and its planner context 422."""
    with_agent = Settings(
        data_dir=data_dir, database_url=database_url, extra_agents=["tests.agents:build_agents"]
    )
    async with open_host(with_agent) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 0"))
        ended = await host.engine.wait_settled(run.run_id)
        view = await host.engine.checkpoint(ended)
        planned = await host.engine.state_before_planning(ended, 1)
    assert ended.state is State.SUCCEEDED and planned is not None

    async with open_host(
        with_agent.model_copy(update={"extra_agents": []}), run_worker=False
    ) as host:
        assert "slow_worker" not in host.engine.graphs
        assert await host.engine.checkpoint(ended) == view
        assert await host.engine.state_before_planning(ended, 1) == planned
