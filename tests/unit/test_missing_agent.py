"""A run of an agent the process that leases it does not have (a fleet mid-deploy, a
server restarted without an agent module): handed back for a process that has it,
never failed with the lookup's KeyError (a probe saw INTERNAL_ERROR, and a side
effect's run ended for good)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from runtime.lifecycle import State
from runtime.model import RunCreate
from server.host import open_host
from server.settings import Settings


async def test_a_process_without_the_runs_agent_hands_it_on_to_one_with_it(
    database_url: str, data_dir: Path
) -> None:
    with_agent = Settings(
        data_dir=data_dir,
        database_url=database_url,
        extra_agents=["tests.agents:build_agents"],
        lease_seconds=1.0,
    )
    without = with_agent.model_copy(update={"extra_agents": []})
    async with open_host(with_agent, run_worker=False) as host:
        run, _ = await host.engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 0"))

    async with open_host(without) as host:
        metrics = host.engine.metrics
        for _ in range(600):  # a bound on a hang, not a speed
            if metrics.value("drives_ended_total", how="no_agent") >= 2:
                break
            await asyncio.sleep(0.05)
        found = await host.store.get_run_to_drive(run.run_id)
        events = await host.store.list_events(run.run_id)

    assert found is not None and found.run.state is State.PENDING and found.failures == 0
    errors = [e.data for e in events if e.type == "error"]
    assert [e["code"] for e in errors] == ["AGENT_NOT_FOUND"]  # once, however often handed
    assert "slow_worker" in errors[0]["message"] and errors[0]["recovery"] == "retry"

    async with open_host(with_agent) as host:
        final = await host.engine.wait_settled(run.run_id)
    assert final.state is State.SUCCEEDED, final.outcome
