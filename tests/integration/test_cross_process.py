"""Two servers on one PostgreSQL database: events cross processes (an approval on one
server is streamed by the other), and 100 identical approvals resume a run once.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.backend import open_backend
from runtime.engine import Engine
from runtime.model import RunCreate
from server.agents import load_agents
from server.settings import Settings
from tests.auth import MGR, OPS
from tests.integration.conftest import Processes, state_is
from tests.integration.scale_out import (
    EAST,
    QUESTION,
    QUICK_EXIT,
    create_run,
    events_of,
    pending_approval,
    wait_all_in_state,
)
from tests.integration.server_proc import (
    ServerProcess,
    WorkerProcess,
)
from tools.retail import count_outbox

# -- 1. events cross processes ---------------------------------------------------


class StreamReader(threading.Thread):
    """Reads an SSE stream on a thread; ``connected`` is set once the response has begun."""

    def __init__(self, url: str, last_event_id: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.last_event_id = last_event_id
        self.connected = threading.Event()
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            current: dict[str, Any] = {}
            with httpx.stream(
                "GET",
                self.url,
                headers={
                    **OPS,
                    "Accept": "text/event-stream",
                    "Last-Event-ID": str(self.last_event_id),
                },
                timeout=httpx.Timeout(60),
            ) as resp:
                resp.raise_for_status()
                for line in resp.iter_lines():
                    self.connected.set()  # the first line is the stream's "retry:" preamble
                    if line.startswith("id: "):
                        current = {"id": int(line[4:])}
                    elif line.startswith("event: "):
                        current["type"] = line[7:]
                    elif line.startswith("data: "):
                        self.events.append((current["id"], current["type"], json.loads(line[6:])))
        except BaseException as exc:
            self.error = exc
        finally:
            self.connected.set()


@pytest.mark.parametrize("b_drives", [True, False], ids=["b-with-worker", "b-http-only"])
def test_approve_on_one_server_stream_on_the_other(
    pg_schema_url: str, data_dir: Path, processes: Processes, b_drives: bool
) -> None:
    a = processes.add(ServerProcess(data_dir, pg_schema_url, **QUICK_EXIT))
    # A long keepalive: B's stream wakes on NOTIFY, or it does not finish in time.
    b = processes.add(
        ServerProcess(
            data_dir,
            pg_schema_url,
            no_worker=not b_drives,
            AGENT_RUNTIME_SSE_KEEPALIVE_S="300",
            **QUICK_EXIT,
        )
    )
    a.start()
    b.start()
    with a.client() as http_a, b.client() as http_b:
        run_id = create_run(http_a, input=QUESTION, context=EAST)
        head = a.follow(run_id, state_is("waiting_human"), timeout=30)
        last_seq = head[-1]["seq"]
        approval_id = pending_approval(http_a, run_id)

        reader = StreamReader(f"{b.base_url}/runs/{run_id}/events", last_seq)
        reader.start()
        assert reader.connected.wait(15) and reader.error is None, reader.error
        assert reader.events == []  # open, and nothing to replay yet

        started = time.monotonic()
        resp = http_a.post(
            f"/runs/{run_id}/approvals/{approval_id}",
            json={"decision": "approve"},
            headers=MGR,
        )
        assert resp.status_code == 202, resp.text
        reader.join(30)
        assert not reader.is_alive(), f"B's stream did not finish: {reader.events}"
        assert reader.error is None, reader.error
        elapsed = time.monotonic() - started
        stored = events_of(http_b, run_id)

    got = reader.events
    assert got, "B's stream showed nothing"
    assert [seq for seq, _, _ in got] == list(range(last_seq + 1, last_seq + 1 + len(got)))
    assert got[0][1] == "approval_result" and got[0][2]["data"]["decision"] == "approved"
    assert got[-1][1] == "state" and got[-1][2]["data"]["to"] == "succeeded"
    assert [(e["seq"], e["type"]) for e in stored[last_seq:]] == [(s, t) for s, t, _ in got]
    types = [t for _, t, _ in got]
    assert "action" in types and "result" in types
    assert elapsed < 30
    assert count_outbox(data_dir / "retail.db") == 1


def test_a_wait_on_an_http_only_server_ends_when_a_worker_settles_the_run(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    """`Prefer: wait` on a server that drives nothing: a worker process parks and ends
    the run, and the waiting requests learn it through PostgreSQL's NOTIFY."""
    api = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True, **QUICK_EXIT))
    worker = processes.add(WorkerProcess(data_dir, pg_schema_url, **QUICK_EXIT))
    api.start()
    worker.start()
    wait = {"Prefer": "wait=20"}  # inside the client's 30 s timeout
    with api.client() as http:
        created = http.post("/runs", json={"input": QUESTION, "context": EAST}, headers=wait)
        assert created.status_code == 201, created.text
        assert created.headers["preference-applied"] == "wait=20"
        parked = created.json()
        assert parked["state"] == "waiting_human", parked
        run_id, approval_id = parked["run_id"], parked["pending_approval"]["approval_id"]
        resp = http.post(
            f"/runs/{run_id}/approvals/{approval_id}", json={"decision": "approve"}, headers=MGR
        )
        assert resp.status_code == 202, resp.text
        done = http.get(f"/runs/{run_id}", headers=wait).json()
        assert done["state"] == "succeeded", done
        assert done["result"]["answer"]
    assert count_outbox(data_dir / "retail.db") == 1


class _RacingStore:
    """A run store whose first empty ``shown_events`` is followed, before the stream reads
    the run, by another process ending the run (its error and terminal state events)."""

    def __init__(self, store: Any, end_run: Callable[[], Any]) -> None:
        self.store = store
        self.end_run = end_run
        self.ended = False

    async def shown_events(self, run_id: str, after: int = 0, limit: int = 1000) -> Any:
        events = await self.store.shown_events(run_id, after, limit)
        if not events and not self.ended:
            self.ended = True
            await self.end_run()  # commits now, between this read and the next
        return events

    async def get_run(self, run_id: str) -> Any:
        return await self.store.get_run(run_id)


def test_stream_does_not_close_before_the_terminal_event(
    pg_schema_url: str, data_dir: Path
) -> None:
    """A stream that finds nothing new reads the run next; if the run ended in between,
    the events of its end (the terminal `state` event among them) must still be sent.
    The window between the two reads, made deterministic."""
    from runtime.adapter import fail_run
    from runtime.errors import Code
    from runtime.eventbus import EventBus
    from server.sse import event_stream

    async def scenario() -> tuple[list[str], list[tuple[int, str]]]:
        settings = Settings(
            data_dir=data_dir,
            database_url=pg_schema_url,
            extra_agents=["tests.agents:build_agents"],
        )
        backend = await open_backend(pg_schema_url)
        try:
            engine = Engine(
                backend.store,
                backend.checkpointer,
                load_agents(settings),
                default_agent=settings.default_agent,
            )
            run, _ = await engine.create_run(
                RunCreate.model_validate({"agent_id": "slow_worker", "input": "sleep 0"})
            )
            run_id = run.run_id
            racing = _RacingStore(
                backend.store,
                lambda: fail_run(backend.store, run_id, Code.RUN_CANCELLED, "ended elsewhere"),
            )
            chunks = [
                chunk.decode()
                async for chunk in event_stream(racing, EventBus(), run_id, 1, keepalive_s=5)  # type: ignore[arg-type]
            ]
            stored = [(e.seq, str(e.type)) for e in await backend.store.list_events(run_id)]
            return chunks, stored
        finally:
            await backend.close()

    chunks, stored = asyncio.run(asyncio.wait_for(scenario(), 30))
    sent = []
    for chunk in chunks:  # "id: <seq>\nevent: <type>\ndata: ...\n\n", or a preamble
        lines = chunk.split("\n")
        if lines[0].startswith("id: "):
            sent.append((int(lines[0][4:]), lines[1].removeprefix("event: ")))
    assert stored[-1][1] == "state"  # the run did end, with its terminal state event
    assert sent == stored[1:], f"the stream sent {sent}; the log has {stored}"


# -- 2. 100 identical approvals on two servers -----------------------------------


def test_hundred_concurrent_identical_approvals_resume_once(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    a = processes.add(ServerProcess(data_dir, pg_schema_url, **QUICK_EXIT))
    b = processes.add(ServerProcess(data_dir, pg_schema_url, **QUICK_EXIT))
    a.start()
    b.start()
    with a.client() as http:
        run_id = create_run(http, input=QUESTION, context=EAST)
        a.follow(run_id, state_is("waiting_human"), timeout=30)
        approval_id = pending_approval(http, run_id)

    async def storm() -> list[int]:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=0)
        async with (
            httpx.AsyncClient(base_url=a.base_url, timeout=30, limits=limits) as ca,
            httpx.AsyncClient(base_url=b.base_url, timeout=30, limits=limits) as cb,
        ):
            go = asyncio.Event()

            async def one(client: httpx.AsyncClient) -> int:
                await go.wait()
                resp = await client.post(
                    f"/runs/{run_id}/approvals/{approval_id}",
                    json={"decision": "approve", "comment": "ok"},
                    headers=MGR,
                )
                assert resp.status_code in (200, 202), resp.text
                assert resp.json()["status"] == "approved"
                return resp.status_code

            tasks = [asyncio.create_task(one(ca if i % 2 else cb)) for i in range(100)]
            await asyncio.sleep(0)  # let every task reach the start line
            go.set()
            return list(await asyncio.gather(*tasks))

    codes = asyncio.run(storm())
    assert codes.count(202) == 1, codes
    assert codes.count(200) == 99

    with b.client() as http:
        wait_all_in_state(http, [run_id], "succeeded", timeout=30)
        trace = http.get(f"/runs/{run_id}/trace").json()
    assert trace["run"]["state"] == "succeeded"
    assert [e["type"] for e in trace["events"]].count("approval_result") == 1
    publishes = [c for c in trace["tool_calls"] if c["tool"] == "publish_report"]
    assert len(publishes) == 1 and publishes[0]["status"] == "succeeded"
    assert publishes[0]["attempts"] == 1, publishes[0]
    assert count_outbox(data_dir / "retail.db") == 1
