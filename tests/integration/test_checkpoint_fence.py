"""A worker that lost its lease writes no checkpoint on its run's thread (PostgreSQL).

The store's writes were always fenced by the lease; LangGraph's checkpoints were not.
A worker paused past its lease that wakes in a node writing nothing of ours (the
guard, here) would save a checkpoint newer than its successor's, and the next drive
would resume that stale branch. Here the takeover happens while the guard decides,
deterministically: the policy bumps the lease as a new holder's claim would. The
other tests hold the fence to what makes it airtight: its row lock, its place last in
the pipeline (a frozen writer holds nothing), and a write cut short before it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from pydantic import BaseModel

from graphs.run_graph import build_run_graph
from runtime.agent import AgentSpec
from runtime.backend import Backend, open_backend
from runtime.checkpointer import LEASE, LEASE_FENCE_SQL, PooledPostgresSaver
from runtime.engine import Engine
from runtime.lifecycle import TERMINAL
from runtime.model import RunContext, RunCreate
from runtime.policy import DefaultPolicy, Policy, Verdict
from runtime.tooling import ToolSpec
from runtime.worker import Worker
from tests.agents import ScriptPlanner, build_tools, call, finish

pytestmark = pytest.mark.postgres

ENDS = ("lease_lost", "failed")
"""How a drive may end in these tests (drives_ended_total's ``how``)."""
THREAD_ROWS = (
    "SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %(t)s) AS checkpoints, "
    "(SELECT count(*) FROM checkpoint_writes WHERE thread_id = %(t)s) AS writes"
)


class TakenOverWhileDeciding:
    """Allows every call; the first time, the run's lease moves on meanwhile (another
    worker's claim) and the rows the run's thread had then are noted."""

    def __init__(self, url: str, *, then_raise: bool = False) -> None:
        self.url = url
        self.then_raise = then_raise
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
            if self.then_raise:
                raise RuntimeError("a policy bug")
        return Verdict("allow")


def engine_of(
    backend: Backend, tmp_path: Path, policy: Policy, saver: PooledPostgresSaver | None = None
) -> Engine:
    """An engine whose one agent calls echo once, through ``policy``, then finishes."""
    tools = build_tools(tmp_path)
    planner = ScriptPlanner(
        lambda view: finish("done") if view.observations else call("echo", text="x", n=1)
    )
    agent = AgentSpec("fenced", "", build_run_graph(planner, tools, policy), tools)
    checkpointer = saver or backend.checkpointer
    return Engine(backend.store, checkpointer, {"fenced": agent}, default_agent="fenced")


async def drive_one(engine: Engine) -> tuple[str, dict[str, int]]:
    """Create a run and let a worker drive it until a drive ends: the run, and how many
    drives ended each way of :data:`ENDS`."""
    worker = Worker(engine, concurrency=1)
    worker.start()
    try:
        run, _ = await engine.create_run(RunCreate(input="go"))
        for _ in range(200):
            ends = {how: engine.metrics.value("drives_ended_total", how=how) for how in ENDS}
            if any(ends.values()):
                break
            await asyncio.sleep(0.05)
        return run.run_id, ends
    finally:
        await worker.stop()


async def test_a_drive_that_lost_its_lease_writes_no_checkpoint(
    pg_schema_url: str, tmp_path: Path
) -> None:
    policy = TakenOverWhileDeciding(pg_schema_url)
    backend = await open_backend(pg_schema_url)
    try:
        run_id, ends = await drive_one(engine_of(backend, tmp_path, policy))
        assert ends == {"lease_lost": 1, "failed": 0}
        assert policy.seen is not None
        async with backend.store.pool.connection() as conn:  # type: ignore[attr-defined]
            cur = await conn.execute(THREAD_ROWS, {"t": run_id})
            after = await cur.fetchone()
        # Not one more checkpoint, nor the guard's writes, after the lease moved on.
        assert after == policy.seen
        found = await backend.store.get_run(run_id)
        assert found is not None and found.state not in TERMINAL
        assert await backend.store.list_tool_calls(run_id) == []
    finally:
        await backend.close()


async def test_a_node_that_fails_after_the_lease_moved_on_leaves_the_run_to_its_holder(
    pg_schema_url: str, tmp_path: Path
) -> None:
    """The failure is not this drive's to record (its fail_run is fenced off): the drive
    ends as one that lost its lease, not as a failed one handed back with a backoff."""
    policy = TakenOverWhileDeciding(pg_schema_url, then_raise=True)
    backend = await open_backend(pg_schema_url)
    try:
        run_id, ends = await drive_one(engine_of(backend, tmp_path, policy))
        assert ends == {"lease_lost": 1, "failed": 0}
        found = await backend.store.get_run_to_drive(run_id)
        assert found is not None and found.run.state not in TERMINAL and found.failures == 0
    finally:
        await backend.close()


async def test_the_fence_holds_the_run_row_against_a_takeover_until_the_commit(
    pg_schema_url: str, tmp_path: Path
) -> None:
    """A takeover that commits between the fence and the checkpoint's commit would let a
    stale checkpoint land after it: the fence's row lock makes the lease bump wait."""
    backend = await open_backend(pg_schema_url)
    engine = engine_of(backend, tmp_path, DefaultPolicy())
    try:
        run, _ = await engine.create_run(RunCreate(input="go"))
        version = await backend.store.take_lease(run.run_id, "w-old", 30.0)
        bump = (
            "UPDATE runs SET lease_version = lease_version + 1, lease_owner = 'w-new' "
            "WHERE run_id = %s"
        )
        with (
            psycopg.connect(pg_schema_url) as checkpoint,  # a transaction, as in a pipeline
            psycopg.connect(pg_schema_url, autocommit=True) as takeover,
        ):
            held = checkpoint.execute(LEASE_FENCE_SQL, (run.run_id, version)).fetchone()
            assert held == (1,)
            takeover.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                takeover.execute(bump, (run.run_id,))
            checkpoint.commit()
            takeover.execute(bump, (run.run_id,))
            with pytest.raises(psycopg.errors.DivisionByZero):
                checkpoint.execute(LEASE_FENCE_SQL, (run.run_id, version))
    finally:
        await backend.close()


class FrozenMidWrite(PooledPostgresSaver):
    """The first checkpoint write of a drive stops once its statements are sent (its
    pipeline open, not synced), as a process paused there would; meanwhile another
    worker takes the run."""

    url = ""
    taken: bool | None = None

    async def _send(self, cur: Any, statements: Any) -> None:
        await super()._send(cur, statements)
        if self.taken is None and LEASE.get() is not None:
            with psycopg.connect(self.url, autocommit=True) as conn:  # blocking: frozen
                conn.execute("SET lock_timeout = '1s'")
                try:
                    conn.execute(
                        "UPDATE runs SET lease_version = lease_version + 1, lease_owner = 'w-new'"
                    )
                    self.taken = True
                except psycopg.errors.LockNotAvailable:
                    self.taken = False


async def test_a_worker_frozen_mid_checkpoint_holds_nothing_a_takeover_waits_for(
    pg_schema_url: str, tmp_path: Path
) -> None:
    """The fence goes last: a worker stopped before it (no idle timeout ends a session
    in the middle of a pipeline) holds no lock on the run, which others can take over
    and cancel; its checkpoint then fails on the fence."""
    backend = await open_backend(pg_schema_url)
    saver = FrozenMidWrite(backend.store.pool)  # type: ignore[attr-defined]
    saver.url = pg_schema_url
    try:
        _, ends = await drive_one(engine_of(backend, tmp_path, DefaultPolicy(), saver))
        assert saver.taken is True
        assert ends == {"lease_lost": 1, "failed": 0}
    finally:
        await backend.close()


class CutMidWrite(PooledPostgresSaver):
    """Stops once a write's statements are sent, before its fence, until ``go`` is set;
    or raises there (``fail``)."""

    def __init__(self, *args: Any, fail: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent = asyncio.Event()
        self.go = asyncio.Event()
        self.fail = fail

    async def _send(self, cur: Any, statements: Any) -> None:
        await super()._send(cur, statements)
        self.sent.set()
        if self.fail:
            raise RuntimeError("serialising the next statement failed")
        await self.go.wait()


@pytest.mark.parametrize("how", ["cancelled", "failed"])
async def test_a_checkpoint_write_cut_before_its_fence_commits_nothing(
    pg_schema_url: str, tmp_path: Path, how: str
) -> None:
    """psycopg syncs, so commits, a pipeline however its block is left: a write cut
    between its statements and the fence (the heartbeat cancelling a drive whose lease
    it found gone; an error) must commit none of it."""
    backend = await open_backend(pg_schema_url)
    saver = CutMidWrite(backend.store.pool, fail=how == "failed")  # type: ignore[attr-defined]
    engine = engine_of(backend, tmp_path, DefaultPolicy(), saver)
    try:
        run, _ = await engine.create_run(RunCreate(input="go"))
        version = await backend.store.take_lease(run.run_id, "w-old", 30.0)
        assert version is not None
        config: Any = {"configurable": {"thread_id": run.run_id, "checkpoint_ns": ""}}
        LEASE.set((run.run_id, version))  # as a drive's task has it; the put's task copies it
        put = asyncio.create_task(saver.aput(config, empty_checkpoint(), {}, {}))
        await asyncio.wait_for(saver.sent.wait(), 10)
        if how == "cancelled":
            async with backend.store.tx() as tx:  # the lease moves on, then its drive stops
                await tx.execute(
                    "UPDATE runs SET lease_version = lease_version + 1 WHERE run_id = ?",
                    (run.run_id,),
                )
            put.cancel()
            saver.go.set()
            with pytest.raises(asyncio.CancelledError):
                await put
        else:
            with pytest.raises(RuntimeError):
                await put
        async with backend.store.pool.connection() as conn:  # type: ignore[attr-defined]
            cur = await conn.execute(THREAD_ROWS, {"t": run.run_id})
            assert await cur.fetchone() == {"checkpoints": 0, "writes": 0}
    finally:
        LEASE.set(None)
        await backend.close()
