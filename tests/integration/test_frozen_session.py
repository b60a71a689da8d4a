"""A process of ours frozen in the middle of a pipelined write (paused, its VM frozen, its
host gone without a word) keeps the run row it locked: PostgreSQL 15 applies no timeout
to a session still reading a statement batch, and TCP takes hours to give up. Workers
end such sessions once they have held on for a lease; nothing else of theirs."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from runtime.lifecycle import State
from runtime.model import RunCreate
from runtime.store.postgres import CONNECTION_KWARGS, open_pool
from runtime.worker import Worker
from server.host import open_host
from server.settings import Settings
from tests.agents import counter_lines
from tests.integration.conftest import Processes, state_is
from tests.integration.scale_out import QUICK_EXIT, create_run, wait_until
from tests.integration.server_proc import ServerProcess, WorkerProcess, free_port

pytestmark = pytest.mark.postgres

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]


@pytest.fixture
async def other_process(pg_schema_url: str) -> AsyncIterator[Pool]:
    """The pool another process of ours would have: the same settings and name."""
    pool = await open_pool(pg_schema_url, max_size=1)
    try:
        yield pool
    finally:
        await pool.close()


async def freeze_mid_pipeline(
    conn: AsyncConnection[DictRow], run_id: str, frozen: asyncio.Event, thawed: asyncio.Event
) -> None:
    """Lock the run row with the first statement of a pipeline, then stop sending."""
    async with conn.pipeline():
        await conn.execute("UPDATE runs SET updated_at = updated_at WHERE run_id = %s", (run_id,))
        await conn.execute("SELECT 1")
        frozen.set()
        await thawed.wait()


async def test_a_run_locked_by_a_frozen_session_is_driven_once_the_session_is_ended(
    pg_schema_url: str, data_dir: Path, other_process: Pool
) -> None:
    settings = Settings(
        data_dir=data_dir,
        database_url=pg_schema_url,
        extra_agents=["tests.agents:build_agents"],
        lease_seconds=1.0,
    )
    async with open_host(settings, run_worker=False) as host:
        engine = host.engine
        run, _ = await engine.create_run(RunCreate(agent_id="slow_worker", input="sleep 0"))
        frozen, thawed = asyncio.Event(), asyncio.Event()
        async with other_process.connection() as conn:
            stuck = asyncio.create_task(freeze_mid_pipeline(conn, run.run_id, frozen, thawed))
            await frozen.wait()
            worker = Worker(engine)
            worker.start()
            try:
                # Claims pass a locked row over (SKIP LOCKED): only ending the frozen
                # session lets a worker take the run.
                settled = await engine.wait_settled(run.run_id, within_s=30)
                assert settled.state is State.SUCCEEDED
                assert engine.metrics.value("frozen_sessions_ended_total") == 1
            finally:
                await worker.stop(grace_s=0)
            thawed.set()  # the process wakes: its session is gone
            with pytest.raises(psycopg.OperationalError):
                await stuck


async def frozen_in_a_read(conn: AsyncConnection[DictRow], pid: int) -> None:
    """Wait until the session ``pid`` holds its lock and waits for the rest of its batch."""
    async with asyncio.timeout(10):
        while True:
            cur = await conn.execute(
                "SELECT state, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
            )
            if await cur.fetchone() == {"state": "active", "wait_event": "ClientRead"}:
                return
            await asyncio.sleep(0.02)


async def test_only_sessions_frozen_on_our_tables_for_the_given_time_are_ended(
    pg_schema_url: str, data_dir: Path, other_process: Pool
) -> None:
    settings = Settings(data_dir=data_dir, database_url=pg_schema_url)
    async with open_host(settings, run_worker=False) as host:
        store = host.store
        run, _ = await host.engine.create_run(RunCreate(agent_id="retail_analyst", input="hi"))
        async with (
            other_process.connection() as ours,
            await AsyncConnection.connect(pg_schema_url, **CONNECTION_KWARGS) as admin,
        ):
            # Another deployment in the same database and role, in a schema of its own
            # (a table named as ours), frozen just the same.
            other_schema = f"t_other_{uuid.uuid4().hex[:8]}"
            await admin.execute(f"CREATE SCHEMA {other_schema}")
            try:
                await admin.execute(
                    f"CREATE TABLE {other_schema}.runs (run_id text, updated_at text)"
                )
                await admin.execute(f"INSERT INTO {other_schema}.runs VALUES (%s)", (run.run_id,))
                stranger = await AsyncConnection.connect(
                    pg_schema_url, **CONNECTION_KWARGS, options=f"-c search_path={other_schema}"
                )
                thawed = asyncio.Event()
                async with stranger:
                    tasks = [
                        asyncio.create_task(
                            freeze_mid_pipeline(c, run.run_id, asyncio.Event(), thawed)
                        )
                        for c in (ours, stranger)
                    ]
                    for c in (ours, stranger):
                        await frozen_in_a_read(admin, c.info.backend_pid)
                    assert not await store.end_frozen_sessions(60.0)  # not for that long yet
                    await asyncio.sleep(0.3)
                    ended = await store.end_frozen_sessions(0.2)
                    assert [row["pid"] for row in ended] == [ours.info.backend_pid]
                    assert ended[0]["ended"] and ended[0]["held_s"] >= 0.2
                    assert not await store.end_frozen_sessions(0.2)  # the other: left alone
                    thawed.set()
                    results = await asyncio.gather(*tasks, return_exceptions=True)
                assert isinstance(results[0], psycopg.OperationalError), results
                assert results[1] is None, results
            finally:
                await admin.execute(f"DROP SCHEMA {other_schema} CASCADE")


def process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat: R, S, T (stopped)…"""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def test_a_worker_frozen_halfway_through_a_write_loses_its_run_to_another(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    """Real processes: the first worker stops itself (SIGSTOP) right after the first
    statement of a pipelined write, the run row locked; the second ends its session
    after a lease and drives the run; the first, continued, writes nothing more."""
    server = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True)).start()
    first = processes.add(
        WorkerProcess(
            data_dir,
            pg_schema_url,
            name="first",
            AGENT_RUNTIME_FAILPOINTS="freeze.pipeline",
            **QUICK_EXIT,
        )
    ).start()
    with server.client() as http:
        run_id = create_run(http, agent_id="slow_worker", input="sleep 0")
        wait_until(lambda: process_state(first.pid) == "T", 30, "the first worker to freeze")
        port = free_port()
        second = processes.add(
            WorkerProcess(
                data_dir,
                pg_schema_url,
                name="second",
                args=("--metrics-port", str(port)),
                AGENT_RUNTIME_METRICS_TOKEN="scrape",
                **QUICK_EXIT,
            )
        ).start()
        server.follow(run_id, state_is("succeeded", "failed"), timeout=60)
        before = http.get(f"/runs/{run_id}/trace").json()
        assert before["run"]["state"] == "succeeded", before["run"]
        assert "frozen in mid-transaction" in second.log_text()
        # The worker's own counters, on its own port.
        scraped = httpx.get(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer scrape"}
        )
        assert "agent_runtime_frozen_sessions_ended_total 1" in scraped.text.splitlines()

        offset = first.log_path.stat().st_size
        first.resume()
        wait_until(
            lambda: first.logged_since(offset, lambda line: run_id in line),
            15,
            "the continued worker to find its run gone",
        )
        after = http.get(f"/runs/{run_id}/trace").json()
        assert first.alive and second.alive
    assert after == before
    assert len(counter_lines(data_dir)) == 1
