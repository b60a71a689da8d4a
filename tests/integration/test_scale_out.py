"""Scale-out and crash safety with real processes over one PostgreSQL database (issue 3).

``serve`` and ``worker`` processes share one data_dir (so one demo database and one
counter.log) and one PostgreSQL schema. Leases last 2 s. Every wait is on a state,
an event, a log line or a file, with a bounded timeout.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable, Iterable
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
from tests.auth import MGR, OPS
from tests.integration.conftest import Processes, state_is
from tests.integration.more_agents import EXTRA_AGENTS
from tests.integration.server_proc import (
    ServerProcess,
    WorkerProcess,
    wait_for_file,
)
from tests.integration.tcp_proxy import TcpProxy
from tools.retail import count_outbox, outbox_rows

EAST = {"scope": ["sales_region:east"]}
QUESTION = "上周华东区销售下滑的主要 SKU 是什么？"
SEED = 20240522
# Shutting down a worker at the end of a test should not wait out a 30 s sleep.
QUICK_EXIT = {"AGENT_RUNTIME_SHUTDOWN_GRACE_S": "0.5"}


# -- helpers ------------------------------------------------------------------


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def runs_in_state(http: httpx.Client, state: str) -> set[str]:
    ids: set[str] = set()
    cursor = None
    while True:
        params: dict[str, Any] = {"state": state, "limit": 200}
        if cursor:
            params["cursor"] = cursor
        page = http.get("/runs", params=params).json()
        ids.update(r["run_id"] for r in page["items"])
        cursor = page.get("next_cursor")
        if not cursor:
            return ids


def wait_all_in_state(
    http: httpx.Client,
    run_ids: Iterable[str],
    state: str,
    timeout: float,
    give_up: Callable[[], str | None] = lambda: None,
) -> None:
    """Wait until every run is in ``state``; fail at once if one failed or ``give_up`` says."""
    wanted = set(run_ids)
    missing: set[str] = set()

    def done() -> bool:
        reason = give_up()
        assert reason is None, reason
        missing.clear()
        missing.update(wanted - runs_in_state(http, state))
        failed = wanted & runs_in_state(http, "failed")
        assert not failed, describe(http, failed)
        return not missing

    try:
        wait_until(done, timeout, f"{len(wanted)} runs to be {state}", every=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {len(missing)} are not:\n{describe(http, missing)}") from None


def describe(http: httpx.Client, run_ids: Iterable[str], most: int = 3) -> str:
    """What a stuck run looks like: state, tool calls, events."""
    out = []
    for run_id in sorted(run_ids)[:most]:
        run = http.get(f"/runs/{run_id}").json()
        calls = [
            (c["tool"], c["status"], c["attempts"])
            for c in http.get(f"/runs/{run_id}/tool-calls").json()
        ]
        events = [
            (e["seq"], e["type"], e["data"].get("to") or e["data"].get("tool"))
            for e in events_of(http, run_id)
        ]
        out.append(f"{run_id} {run['state']} outcome={run.get('outcome')} calls={calls}")
        out.append(f"  events={events}")
    return "\n".join(out)


def create_run(http: httpx.Client, **body: Any) -> str:
    resp = http.post("/runs", json=body)
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["run_id"]
    return run_id


def events_of(http: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    resp = http.get(f"/runs/{run_id}/events", headers={"Accept": "application/json"})
    resp.raise_for_status()
    events: list[dict[str, Any]] = resp.json()
    return events


def pending_approval(http: httpx.Client, run_id: str) -> str:
    run = http.get(f"/runs/{run_id}").json()
    assert run["state"] == "waiting_human", run
    approval_id: str = run["pending_approval"]["approval_id"]
    return approval_id


def start_workers(*workers: WorkerProcess) -> None:
    """Start several at once (they import in parallel), then wait for each."""
    for worker in workers:
        worker.start(wait=False)
    for worker in workers:
        worker.wait_started()


class Leases:
    """Reads the runs table directly: which runs a worker process holds a lease on."""

    def __init__(self, database_url: str) -> None:
        self.conn = psycopg.connect(database_url, autocommit=True)

    def held_by(self, pid: int) -> list[str]:
        # default_owner() is "<host>:<pid>:<random>"; a released lease has no owner.
        rows = self.conn.execute(
            "SELECT run_id FROM runs WHERE lease_owner LIKE %s", (f"%:{pid}:%",)
        ).fetchall()
        return [r[0] for r in rows]

    def versions(self) -> dict[str, int]:
        rows = self.conn.execute("SELECT run_id, lease_version FROM runs").fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def close(self) -> None:
        self.conn.close()


def takeovers(versions: dict[str, int]) -> int:
    """Claims beyond the two a retail run needs (to start, and after its approval)."""
    return sum(max(0, v - 2) for v in versions.values())


# -- 1. many runs, many workers, random SIGKILLs --------------------------------


def test_fifty_retail_runs_survive_random_worker_sigkills(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    rng = random.Random(SEED)
    server = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True)).start()
    workers = [
        processes.add(
            WorkerProcess(data_dir, pg_schema_url, concurrency=4, name=f"w{i}", **QUICK_EXIT)
        )
        for i in range(3)
    ]
    start_workers(*workers)
    leases = Leases(pg_schema_url)
    kills: list[tuple[str, int]] = []  # (worker, runs it held when killed)

    def stuck() -> str | None:
        for worker in workers:
            if "IllegalTransition" in worker.log_text():
                return f"{worker.name} cannot drive a run: {worker.log_text()[-2000:]}"
        return None

    def kill_one_at_random() -> None:
        # Not the one killed last time: it may still be starting up.
        victim = rng.choice([w for w in workers if not kills or w.name != kills[-1][0]])
        jitter = rng.uniform(0.0, 0.15)
        victim.wait_started()
        # A moment when it is driving something, then a random bit later, mid-step.
        try:
            wait_until(lambda: leases.held_by(victim.pid), 5, f"{victim.name} to drive", every=0.02)
        except AssertionError:
            pass  # a kill at an idle moment is still a kill
        time.sleep(jitter)  # the random moment; not a wait for behaviour
        held = len(leases.held_by(victim.pid))
        victim.kill()
        kills.append((victim.name, held))
        victim.start(wait=False)  # back at once; it joins when it has started

    try:
        with server.client() as http:
            run_ids: list[str] = []
            for size in (13, 13, 12, 12):
                run_ids += [create_run(http, input=QUESTION, context=EAST) for _ in range(size)]
                kill_one_at_random()
            assert len(set(run_ids)) == 50
            wait_all_in_state(http, run_ids, "waiting_human", timeout=60, give_up=stuck)

            approvals = {run_id: pending_approval(http, run_id) for run_id in run_ids}
            order = list(run_ids)
            rng.shuffle(order)
            for batch in (order[:13], order[13:26], order[26:38], order[38:]):
                for run_id in batch:
                    resp = http.post(
                        f"/runs/{run_id}/approvals/{approvals[run_id]}",
                        json={"decision": "approve"},
                        headers=MGR,
                    )
                    assert resp.status_code == 202, resp.text
                kill_one_at_random()
            wait_all_in_state(http, run_ids, "succeeded", timeout=60, give_up=stuck)

            keys: set[str] = set()
            for run_id in run_ids:
                trace = http.get(f"/runs/{run_id}/trace").json()
                publishes = [c for c in trace["tool_calls"] if c["tool"] == "publish_report"]
                assert len(publishes) == 1, publishes
                assert publishes[0]["status"] == "succeeded", publishes[0]
                keys.add(publishes[0]["idempotency_key"])
                assert [a["status"] for a in trace["approvals"]] == ["approved"]
                events = trace["events"]
                assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
                assert [e["type"] for e in events].count("approval_result") == 1
                assert events[-1]["type"] == "state" and events[-1]["data"]["to"] == "succeeded"
        versions = leases.versions()
    finally:
        leases.close()

    rows = outbox_rows(data_dir / "retail.db")
    assert len(rows) == 50
    assert len({r["idempotency_key"] for r in rows}) == 50
    assert {r["idempotency_key"] for r in rows} == keys
    print(f"kills (worker, leases held): {kills}; takeovers: {takeovers(versions)}")
    assert len(kills) == 8
    # The chaos did hit work in flight, and other workers took those runs over.
    assert any(held for _, held in kills), kills
    assert takeovers(versions) > 0, "no run was ever taken over from a killed worker"


# -- 2. a paused worker cannot write over the new owner -------------------------


@pytest.mark.parametrize(
    "first_sleep",
    [8, 1],
    ids=["continued-mid-sleep", "sleep-ended-while-stopped"],
)
def test_paused_worker_cannot_write_after_its_lease_was_taken(
    pg_schema_url: str, data_dir: Path, processes: Processes, first_sleep: int
) -> None:
    """SIGSTOP a worker mid-call, let another take the run over, SIGCONT the first.

    With a long sleep the first is continued while its handler still runs; with a
    short one the handler has returned while the process was stopped, so the first
    thing it does when continued is try to record the outcome (a fenced write).
    """
    server = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True)).start()
    first = processes.add(
        WorkerProcess(data_dir, pg_schema_url, concurrency=2, name="first", **QUICK_EXIT)
    ).start()
    with server.client() as http:
        run_id = create_run(http, agent_id="slow_worker", input=f"sleep {first_sleep}")
        wait_for_file(data_dir / "sleep.log")  # the sleep handler has started in `first`
        assert len(counter_lines(data_dir)) == 1
        first.pause()
        second = processes.add(
            WorkerProcess(
                data_dir,
                pg_schema_url,
                concurrency=2,
                name="second",
                TEST_SLEEP_OVERRIDE="0.05",
                **QUICK_EXIT,
            )
        ).start()
        server.follow(run_id, state_is("succeeded", "failed"), timeout=30)
        before = http.get(f"/runs/{run_id}/trace").json()
        checkpoint_before = http.get(f"/runs/{run_id}/checkpoint").json()
        assert before["run"]["state"] == "succeeded", before["run"]
        # `second` re-ran the idempotent sleep under a newer lease.
        sleeps = (data_dir / "sleep.log").read_text().splitlines()
        assert len(sleeps) == 2 and sleeps[0] == sleeps[1]

        first.resume()
        # `first` wakes up, finds its lease gone (heartbeat or fenced write) and says so.
        wait_until(
            lambda: [ln for ln in first.log_text().splitlines() if "lease" in ln and run_id in ln],
            10,
            "the paused worker to notice it lost its lease",
        )
        after = http.get(f"/runs/{run_id}/trace").json()
        checkpoint_after = http.get(f"/runs/{run_id}/checkpoint").json()
        assert first.alive and second.alive
    assert after == before
    assert checkpoint_after == checkpoint_before
    assert len(counter_lines(data_dir)) == 1
    assert len((data_dir / "sleep.log").read_text().splitlines()) == 2


# -- 3. events cross processes ---------------------------------------------------


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


class _RacingStore:
    """A run store whose first empty ``list_events`` is followed, before the stream reads
    the run, by another process ending the run (its error and terminal state events)."""

    def __init__(self, store: Any, end_run: Callable[[], Any]) -> None:
        self.store = store
        self.end_run = end_run
        self.ended = False

    async def list_events(self, run_id: str, after: int = 0, limit: int = 1000) -> Any:
        events = await self.store.list_events(run_id, after, limit)
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
            stored = [(e.seq, e.type) for e in await backend.store.list_events(run_id)]
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


# -- 4. 100 identical approvals on two servers -----------------------------------


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


# -- 5. the database goes away for a few seconds ----------------------------------


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


# -- 6. a dead worker's runs are taken over ----------------------------------------


def test_killed_worker_runs_are_taken_over_by_another(
    pg_schema_url: str, data_dir: Path, processes: Processes
) -> None:
    server = processes.add(ServerProcess(data_dir, pg_schema_url, no_worker=True)).start()
    first = processes.add(
        WorkerProcess(data_dir, pg_schema_url, concurrency=4, name="first", **QUICK_EXIT)
    ).start()
    with server.client() as http:
        run_ids = [create_run(http, agent_id="slow_worker", input="sleep 30") for _ in range(3)]
        wait_until(
            lambda: (
                len((data_dir / "sleep.log").read_text().splitlines()) == 3
                if (data_dir / "sleep.log").exists()
                else False
            ),
            30,
            "three sleeps to start in the first worker",
        )
        leases = Leases(pg_schema_url)
        try:
            assert sorted(leases.held_by(first.pid)) == sorted(run_ids)
            first.kill()
            second = processes.add(
                WorkerProcess(
                    data_dir,
                    pg_schema_url,
                    concurrency=4,
                    name="second",
                    TEST_SLEEP_OVERRIDE="0.05",
                    **QUICK_EXIT,
                )
            ).start()
            for run_id in run_ids:
                server.follow(run_id, state_is("succeeded", "failed"), timeout=30)
            versions = leases.versions()
        finally:
            leases.close()
        counters = []
        for run_id in run_ids:
            run = http.get(f"/runs/{run_id}").json()
            assert run["state"] == "succeeded", run
            calls = http.get(f"/runs/{run_id}/tool-calls").json()
            assert [c["tool"] for c in calls] == ["counter", "sleep"]
            assert calls[0]["attempts"] == 1 and calls[1]["attempts"] == 2, calls
            counters.append(calls[0]["tool_call_id"])
            assert versions[run_id] >= 2
        assert second.alive
    lines = counter_lines(data_dir)
    assert len(lines) == 3
    assert sorted(line.split()[0] for line in lines) == sorted(counters)


# -- 7. a crash after a superstep's writes, before its checkpoint -------------------


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
