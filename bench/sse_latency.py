"""SSE delivery latency: from an event's write to its frame reaching a client.

Each event's ``ts`` is stamped by the store as it inserts the row, inside the
transaction that commits it; a client reading the run's stream notes when each frame
arrives (same host, same clock). The difference is the latency of one event,
*written → delivered*: the rest of its transaction and the commit, then the delivery
(an upper bound on commit → delivered). Only live events count: those written after
the client's stream was open, not the log a stream replays when it opens.

Three setups, each with a fresh database, in one process session, their order
rotating between repetitions:

* **one process, PostgreSQL**: ``agent-runtime serve`` with its in-process worker;
  the stream is woken by the store's in-process listener;
* **API + worker, PostgreSQL**: ``serve --no-worker`` and a separate ``agent-runtime
  worker``: every event crosses processes by ``LISTEN``/``NOTIFY``, then a read;
* **one process, SQLite**: the embedded default (``make run``).

One *flow* is the demo question with the deterministic planner: ``POST /runs``, its
stream until ``waiting_human``; a second stream opened, the approval sent, that
stream until ``succeeded`` (so every event after the approval is live). 1 client,
then 20 at once. Client and servers share the machine's two cores: at 20 clients the
figure includes the client's own wait for the CPU.

``python -m bench.sse_latency [--reps N] [--flows N] [--quick]``
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, aclosing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench import markdown_table
from bench._http import approver_headers, async_client, frames, state_is
from bench._pg import pg_database
from bench._proc import Agentrt
from bench.http_throughput import EAST, QUESTION, pct

SETUPS = ("one process, PostgreSQL", "API + worker, PostgreSQL", "one process, SQLite")
CLIENTS = (1, 20)
HEADER = ["setup", "clients", "live events", "p50", "p95", "p99", "max"]

Event = dict[str, Any]


async def live_stream(
    http: httpx.AsyncClient,
    run_id: str,
    after: int,
    until: Callable[[Event], bool],
    opened: asyncio.Event | None = None,
) -> tuple[list[Event], list[float]]:
    """The run's events after ``after`` until ``until(event)``, and the latency (s) of
    each one written after the stream was open. ``opened`` is set once it is."""
    events: list[Event] = []
    latencies: list[float] = []
    open_at = float("inf")

    def on_open() -> None:
        nonlocal open_at
        open_at = time.time()
        if opened is not None:
            opened.set()

    async with aclosing(frames(http, run_id, after, opened=on_open)) as stream:
        async for event in stream:
            arrived = time.time()
            events.append(event)
            written = datetime.fromisoformat(event["ts"]).timestamp()
            if written >= open_at:
                latencies.append(arrived - written)
            if until(event):
                return events, latencies
    raise RuntimeError(f"stream of {run_id} ended before the awaited event: {events[-3:]}")


async def flow(http: httpx.AsyncClient) -> list[float]:
    """One demo flow, its live events' latencies."""
    resp = await http.post("/runs", json={"input": QUESTION, "context": EAST})
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["run_id"]
    ended = state_is("waiting_human", "succeeded", "failed")
    head, latencies = await live_stream(http, run_id, 0, ended)
    assert head[-1]["data"]["to"] == "waiting_human", head[-3:]
    run = (await http.get(f"/runs/{run_id}")).json()
    approval_id = run["pending_approval"]["approval_id"]
    opened = asyncio.Event()
    tail = asyncio.create_task(
        live_stream(http, run_id, head[-1]["seq"], state_is("succeeded", "failed"), opened)
    )
    await opened.wait()
    resp = await http.post(
        f"/runs/{run_id}/approvals/{approval_id}",
        json={"decision": "approve", "comment": "ok"},
        headers=approver_headers(),
    )
    assert resp.status_code == 202, resp.text
    events, after = await tail
    assert events[-1]["data"]["to"] == "succeeded", events[-3:]
    return latencies + after


async def load(base_url: str, clients: int, flows: int) -> list[float]:
    async with async_client(base_url) as http:

        async def client() -> list[float]:
            got: list[float] = []
            for _ in range(flows):
                got += await flow(http)
            return got

        return [x for got in await asyncio.gather(*(client() for _ in range(clients))) for x in got]


@dataclass
class Latencies:
    setup: str
    clients: int
    values: list[float] = field(default_factory=list)

    def row(self) -> list[str]:
        ms = [f"{pct(self.values, q) * 1000:.1f} ms" for q in (0.5, 0.95, 0.99, 1.0)]
        return [self.setup, str(self.clients), str(len(self.values)), *ms]


@dataclass
class SseResult:
    by: dict[tuple[str, int], Latencies]

    def rows(self) -> list[list[str]]:
        return [self.by[s, n].row() for n in CLIENTS for s in SETUPS]

    def crossing(self, clients: int = 1) -> float:
        """p50 across processes over p50 in one (PostgreSQL both): what NOTIFY costs."""
        one = pct(self.by[SETUPS[0], clients].values, 0.5)
        return pct(self.by[SETUPS[1], clients].values, 0.5) / one


@contextmanager
def servers(tmp: Path) -> Iterator[dict[str, str]]:
    """The base URL of each setup's API, its processes running (stopped afterwards)."""
    with ExitStack() as stack:
        procs: list[Agentrt] = []

        @stack.callback
        def stop() -> None:
            for proc in procs:
                proc.stop()

        one_url = stack.enter_context(pg_database())
        split_url = stack.enter_context(pg_database())
        for name in ("one", "api", "worker", "sqlite"):
            (tmp / name).mkdir()
        concurrency = {"AGENT_RUNTIME_WORKER_CONCURRENCY": "20"}
        one = Agentrt(tmp / "one", one_url, env=concurrency)
        api = Agentrt(tmp / "api", split_url, no_worker=True, name="api")
        worker = Agentrt(tmp / "worker", split_url, command="worker", name="worker", concurrency=20)
        sqlite = Agentrt(
            tmp / "sqlite", f"sqlite:///{tmp / 'sqlite' / 'runtime.db'}", env=concurrency
        )
        procs += [one, api, worker, sqlite]
        for proc in procs:
            proc.start(wait=False)
        for proc in procs:
            proc.wait_started()
        yield {SETUPS[0]: one.base_url, SETUPS[1]: api.base_url, SETUPS[2]: sqlite.base_url}


async def _measure(urls: dict[str, str], reps: int, flows: int) -> SseResult:
    by = {(s, n): Latencies(s, n) for s in SETUPS for n in CLIENTS}
    for setup in SETUPS:  # warm-up: imports, pools, the graph's first compile
        await load(urls[setup], 1, 2)
        await load(urls[setup], 20, 1)
    for i in range(reps):
        for n in CLIENTS:
            for setup in SETUPS[i % 3 :] + SETUPS[: i % 3]:
                by[setup, n].values += await load(urls[setup], n, flows if n == 1 else 1)
    return SseResult(by)


def measure(reps: int = 5, flows: int = 6) -> SseResult:
    with tempfile.TemporaryDirectory(prefix="bench-sse-") as tmpdir, servers(Path(tmpdir)) as urls:
        return asyncio.run(_measure(urls, reps, flows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--flows", type=int, default=6, help="flows of the single client per rep")
    parser.add_argument("--quick", action="store_true", help="3 reps, 3 flows")
    args = parser.parse_args()
    if args.quick:
        args.reps, args.flows = 3, 3
    result = measure(args.reps, args.flows)
    print(markdown_table(HEADER, result.rows()))
    print(f"\nAcross processes / in one (p50, 1 client): {result.crossing():.2f}x")


if __name__ == "__main__":
    main()
