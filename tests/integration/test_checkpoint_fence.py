"""A worker that lost its lease writes no checkpoint on its run's thread (PostgreSQL).

The store's writes were always fenced by the lease; LangGraph's checkpoints were not.
A worker paused past its lease that wakes in a node writing nothing of ours (the
guard, here) would save a checkpoint newer than its successor's, and the next drive
would resume that stale branch. Here the takeover happens while the guard decides,
deterministically: the policy bumps the lease as a new holder's claim would.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest
from pydantic import BaseModel

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec
from runtime.backend import open_backend
from runtime.engine import Engine
from runtime.lifecycle import TERMINAL
from runtime.model import RunContext, RunCreate
from runtime.policy import Verdict
from runtime.tooling import ToolSpec
from runtime.worker import Worker
from tests.agents import ScriptPlanner, build_tools, call, finish

pytestmark = pytest.mark.postgres

THREAD_ROWS = (
    "SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %(t)s) AS checkpoints, "
    "(SELECT count(*) FROM checkpoint_writes WHERE thread_id = %(t)s) AS writes"
)


class TakenOverWhileDeciding:
    """Allows every call; the first time, the run's lease moves on meanwhile (another
    worker's claim) and the rows the run's thread had then are noted."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: dict[str, int] | None = None

    def decide(self, tool: ToolSpec, args: BaseModel, context: RunContext) -> Verdict:
        if self.seen is None:
            # Blocking, in the guard: nothing else of this drive may run meanwhile.
            with psycopg.connect(self.url, autocommit=True) as conn:
                run_id = conn.execute("SELECT run_id FROM runs").fetchone()
                assert run_id is not None
                conn.execute(
                    "UPDATE runs SET lease_version = lease_version + 1, "
                    "lease_owner = 'w-new' WHERE run_id = %s",
                    run_id,
                )
                rows = conn.execute(THREAD_ROWS, {"t": run_id[0]}).fetchone()
                assert rows is not None
                self.seen = {"checkpoints": rows[0], "writes": rows[1]}
        return Verdict("allow")


async def test_a_drive_that_lost_its_lease_writes_no_checkpoint(
    pg_schema_url: str, tmp_path: Path
) -> None:
    tools = build_tools(tmp_path)
    policy = TakenOverWhileDeciding(pg_schema_url)
    planner = ScriptPlanner(
        lambda view: finish("done") if view.observations else call("echo", text="x", n=1)
    )
    agent = AgentSpec("fenced", "", build_run_graph(planner, tools, policy), tools)
    backend = await open_backend(pg_schema_url)
    engine = Engine(backend.store, backend.checkpointer, {"fenced": agent}, default_agent="fenced")
    worker = Worker(engine, concurrency=1)
    try:
        worker.start()
        run, _ = await engine.create_run(RunCreate(input="go"))
        for _ in range(200):
            if engine.metrics.value("drives_ended_total", how="lease_lost"):
                break
            await asyncio.sleep(0.05)
        assert engine.metrics.value("drives_ended_total", how="lease_lost") == 1
        assert policy.seen is not None
        async with backend.store.pool.connection() as conn:  # type: ignore[attr-defined]
            cur = await conn.execute(THREAD_ROWS, {"t": run.run_id})
            after = await cur.fetchone()
        # Not one more checkpoint, nor the guard's writes, after the lease moved on.
        assert after == policy.seen
        found = await backend.store.get_run(run.run_id)
        assert found is not None and found.state not in TERMINAL
        assert await backend.store.list_tool_calls(run.run_id) == []
    finally:
        await worker.stop()
        await backend.close()
