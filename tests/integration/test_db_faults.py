"""The database fails under a running drive: an outage of a few seconds mid-run, and a
crash after a superstep's writes but before its checkpoint.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from runtime.backend import open_backend
from runtime.engine import Engine
from runtime.model import RunCreate
from server.agents import load_agents
from server.settings import Settings
from tests.agents import counter_lines
from tests.auth import MGR
from tests.integration.conftest import Processes, state_is
from tests.integration.more_agents import EXTRA_AGENTS
from tests.integration.scale_out import (
    EAST,
    QUESTION,
    QUICK_EXIT,
    create_run,
    events_of,
    wait_until,
)
from tests.integration.server_proc import (
    ServerProcess,
    WorkerProcess,
    wait_for_file,
)
from tests.integration.tcp_proxy import TcpProxy
from tools.retail import count_outbox

# -- 1. the database goes away for a few seconds ----------------------------------


def via_proxy(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{proxy.host}:{proxy.port}" if userinfo else f"{proxy.host}:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.mark.parametrize(
    ("agent", "order"),
    [("slow_worker", ["counter", "sleep"]), ("sleep_then_count", ["sleep", "counter"])],
    ids=["effect-before-outage", "effect-due-during-outage"],
)
def test_database_outage_mid_run_then_the_run_finishes(
    pg_schema_url: str, data_dir: Path, processes: Processes, agent: str, order: list[str]
) -> None:
    """The database becomes unreachable while the sleep tool runs, for about 4 s.

    slow_worker did its side effect (counter) before; sleep_then_count's is due right
    after the sleep, which ends (after 1 s) while the database is still away: nothing
    may be executed until it is back.
    """
    target = urlsplit(pg_schema_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    try:
        server = processes.add(
            ServerProcess(
                data_dir,
                via_proxy(pg_schema_url, proxy),
                AGENT_RUNTIME_EXTRA_AGENTS=EXTRA_AGENTS,
                **QUICK_EXIT,
            )
        ).start()
        with server.client() as http:
            seconds = 3 if agent == "slow_worker" else 1
            run_id = create_run(http, agent_id=agent, input=f"sleep {seconds}")
            wait_for_file(data_dir / "sleep.log")
            effects_before = len(counter_lines(data_dir))
            assert effects_before == (1 if agent == "slow_worker" else 0)

            proxy.cut()
            with pytest.raises(psycopg.OperationalError):
                psycopg.connect(via_proxy(pg_schema_url, proxy), connect_timeout=2).close()
            time.sleep(4)  # the outage itself: the one time-based step
            # The sleep has ended by now; no side effect while the database is away.
            assert len(counter_lines(data_dir)) == effects_before
            proxy.restore()

            def finished() -> dict[str, Any] | None:
                try:
                    run: dict[str, Any] = http.get(f"/runs/{run_id}", timeout=5).json()
                except (httpx.HTTPError, ValueError):
                    return None
                return run if run.get("state") in ("succeeded", "failed") else None

            final = wait_until(finished, 45, "the run to finish after the outage", every=0.2)
            assert final["state"] == "succeeded", final
            calls = http.get(f"/runs/{run_id}/tool-calls").json()
            events = events_of(http, run_id)
    finally:
        proxy.close()
    assert [c["tool"] for c in calls] == order
    assert [c["status"] for c in calls] == ["succeeded", "succeeded"]
    assert len(counter_lines(data_dir)) == 1
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["data"]["to"] == "succeeded"


# -- 2. a crash after a superstep's writes, before its checkpoint -------------------


class _Killed(BaseException):
    """Stands in for SIGKILL inside a process: no ``except Exception`` sees it, so
    nothing more is written (the lease is not released either)."""


def _crashing_saver(pool: Any, crash_at: int) -> Any:
    """LangGraph's Postgres checkpointer, dying instead of writing checkpoint ``crash_at``.

    By then the superstep's task writes are saved (``aput_writes``) and the ledger has
    whatever the tasks did: exactly the state a SIGKILL in that window leaves behind.
    """
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    class CrashingSaver(AsyncPostgresSaver):
        puts = 0

        async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            self.puts += 1
            if self.puts == crash_at:
                raise _Killed(f"killed before checkpoint #{crash_at}")
            return await super().aput(config, checkpoint, metadata, new_versions)

    return CrashingSaver(pool)


async def _drive_until_killed(url: str, data_dir: Path, crash_at: int) -> tuple[str, Any]:
    """Create a retail run and drive it in this process until the checkpointer 'dies'."""
    settings = Settings(
        data_dir=data_dir, database_url=url, extra_agents=["tests.agents:build_agents"]
    )
    backend = await open_backend(url)
    try:
        store: Any = backend.store
        engine = Engine(
            store,
            _crashing_saver(store.pool, crash_at),
            load_agents(settings),
            default_agent=settings.default_agent,
            owner="doomed:0:000000",
            lease_s=2,
        )
        # Created in-process, past the API: the context names the tests' caller itself.
        context = {"user_id": "u-ops-001", "tenant_id": "demo-retail", **EAST}
        run, _ = await engine.create_run(
            RunCreate.model_validate({"input": QUESTION, "context": context})
        )
        [(run_id, version)] = await store.claim_runs(engine.owner, 1, 2)
        assert run_id == run.run_id
        engine.start_drive(run_id, version)
        with pytest.raises(_Killed):
            await engine.drives[run_id].task
        config = {"configurable": {"thread_id": run_id}}
        snapshot = await engine.graphs[run.agent_id].aget_state(config)
        return run_id, snapshot
    finally:
        await backend.close()


@pytest.mark.parametrize(
    "crash_at",
    [2, 5],
    ids=["after-start-writes", "after-query-sales-writes"],
)
def test_crash_after_task_writes_before_checkpoint_resumes(
    pg_schema_url: str, data_dir: Path, processes: Processes, crash_at: int
) -> None:
    """The issue's "between the ledger write and the checkpoint write", one step later:
    the node has returned and LangGraph saved its writes, the checkpoint is not saved.

    Checkpoint #1 is the input, #2 the end of the __start__ superstep, #3 planner,
    #4 guard, #5 executor (query_sales ran and is in the ledger).
    """
    run_id, snapshot = asyncio.run(_drive_until_killed(pg_schema_url, data_dir, crash_at))
    # The crash window: the superstep's task has its writes, no later checkpoint exists.
    assert snapshot.values and snapshot.next == () and snapshot.tasks, snapshot

    server = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True)).start()
    worker = processes.add(WorkerProcess(data_dir, pg_schema_url, name="next", **QUICK_EXIT))
    worker.start()
    with server.client() as http:

        def settled() -> str | None:
            state: str = http.get(f"/runs/{run_id}").json()["state"]
            if state in ("waiting_human", "succeeded", "failed"):
                return state
            # A run that cannot be driven stays pending: fail on the first logged error.
            return "cannot drive it" if " ERROR " in worker.log_text() else None

        state = wait_until(settled, 30, "the taken-over run to settle")
        run = http.get(f"/runs/{run_id}").json()
        assert state == "waiting_human", (state, run.get("outcome"))
        calls = http.get(f"/runs/{run_id}/tool-calls").json()
        assert [c["attempts"] for c in calls if c["tool"] == "query_sales"] == [1]
        resp = http.post(
            f"/runs/{run_id}/approvals/{run['pending_approval']['approval_id']}",
            json={"decision": "approve"},
            headers=MGR,
        )
        assert resp.status_code == 202
        server.follow(run_id, state_is("succeeded", "failed"), timeout=30)
        assert http.get(f"/runs/{run_id}").json()["state"] == "succeeded"
    assert count_outbox(data_dir / "retail.db") == 1
