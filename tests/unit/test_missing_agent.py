"""A run of an agent the process that leases it does not have (a fleet mid-deploy, a
server restarted without an agent module): handed back for a process that has it,
never failed with the lookup's KeyError (a probe saw INTERNAL_ERROR, and a side
effect's run ended for good)."""

from __future__ import annotations

import asyncio
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


async def test_a_process_without_the_runs_agent_hands_it_on_to_one_with_it(
    database_url: str, data_dir: Path
) -> None:
    run, with_agent, without = await run_of_an_agent_then_without_it(database_url, data_dir)

    async with open_host(without) as host:
        metrics = host.engine.metrics
        for _ in range(600):  # a bound on a hang, not a speed
            if metrics.value("drives_ended_total", how="no_agent") >= 2:
                break
            await asyncio.sleep(0.05)
        assert metrics.value("drives_ended_total", how="no_agent") >= 2
        found = await host.store.get_run_to_drive(run.run_id)
        events = await host.store.list_events(run.run_id)

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
        async with asyncio.timeout(30):  # a bound on a hang, not a speed
            await handing.wait()
        ended = await engine.cancel(run.run_id, "agent retired", wait_s=30)
        found = await host.store.get_run_to_drive(run.run_id)

    assert ended.state is State.FAILED and ended.outcome is not None
    assert ended.outcome.code == "RUN_CANCELLED"
    assert found is not None and found.failures == 0
    assert engine.metrics.value("drives_ended_total", how="failed") == 0
