"""HTTP throughput and latency of the demo flow: our server (PostgreSQL) vs ``langgraph dev``.

One *flow* = the retail demo question, with the deterministic planner, from creation
through its approval interrupt and an approval to a succeeded run.

* **ours**: ``agent-runtime serve`` (HTTP and its in-process worker, concurrency 20)
  on a fresh PostgreSQL database, driven two ways:

  - **wait** (what the peer's ``runs/wait`` does): ``POST /runs`` with ``Prefer: wait``
    answers with the run parked for approval; ``POST /runs/{id}/approvals/{ap}`` with
    ``Prefer: wait`` answers with the decision and the succeeded run (two requests; the
    peer's flow is three, its thread's creation included);
  - **SSE** (a client that shows every event): ``POST /runs``; ``GET /runs/{id}/events``
    until ``state → waiting_human`` (the ``approval_request`` event names the
    approval); the approval; SSE again from the last seq until ``state → succeeded``.
* **peer**: ``langgraph dev --n-jobs-per-worker 20`` serving graphs/studio.py's
  ``retail_analyst`` (in-memory checkpointer, no durability of its own; the graph's
  nodes still write their ledger to ``$AGENT_RUNTIME_DATA_DIR/studio.db``), driven
  through its own API with ``langgraph_sdk``: ``threads.create``; ``runs.wait``
  (input) which returns at the interrupt; ``runs.wait`` with
  ``Command(resume={"decision": "approve"})`` which returns the final state.

Both servers run at once in this process session. Each repetition measures, for
each side (the order rotating between repetitions): 1 client doing ``--flows1``
flows one after another (latency of each whole flow), then 20 clients each doing
``--flows20`` flows (runs/s = flows / wall time). We report medians over
repetitions and the median of the per-repetition ratios. We also read each server's
CPU time (/proc/<pid>/stat, the whole process group for ``langgraph dev``) around
every load: CPU per flow and cores busy say whether a side is CPU-bound.

``python -m bench.http_throughput [--reps N] [--quick]``
``python -m bench.http_throughput --profile [--clients N] [--flow wait|sse] [--profile-out F]``:
cProfile of our server under N clients (20), optionally keeping the .prof file.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from bench import markdown_table, median, pg_schema
from bench._http import approver_headers, async_client, follow, state_is
from bench._pg import BackendCpu, committed, pg_database
from bench._proc import Agentrt, LanggraphDev, cpu_seconds

QUESTION = "上周华东区销售下滑的主要 SKU 是什么？"
EAST = {"scope": ["sales_region:east"]}  # who: the token (bench._http)
PEER_GRAPH = "retail_analyst"
PEER_INPUT: dict[str, Any] = {"input": QUESTION, "context": {"scope": ["sales_region:east"]}}
CLIENTS = (1, 20)
TARGET_RATIO = 3.0
"""Issue #6: ours ≥ 3× the peer's runs/s at 20 clients."""
TARGET_P50_S = 0.100
"""Issue #6: p50 of one client's whole flow < 100 ms (deterministic planner)."""

Flow = Callable[[], Awaitable[None]]


async def ours_sse_flow(http: httpx.AsyncClient) -> None:
    resp = await http.post("/runs", json={"input": QUESTION, "context": EAST})
    assert resp.status_code == 201, resp.text
    run_id = resp.json()["run_id"]
    head = await follow(http, run_id, state_is("waiting_human", "succeeded", "failed"))
    assert head[-1]["data"]["to"] == "waiting_human", head[-3:]
    requests = [e for e in head if e["type"] == "approval_request"]
    approval_id = requests[-1]["data"].get("approval_id") if requests else None
    if approval_id is None:
        run = (await http.get(f"/runs/{run_id}")).json()
        approval_id = run["pending_approval"]["approval_id"]
    resp = await http.post(
        f"/runs/{run_id}/approvals/{approval_id}",
        json={"decision": "approve", "comment": "ok"},
        headers=approver_headers(),
    )
    assert resp.status_code == 202, resp.text
    tail = await follow(http, run_id, state_is("succeeded", "failed"), after=head[-1]["seq"])
    assert tail[-1]["data"]["to"] == "succeeded", tail[-3:]


async def ours_wait_flow(http: httpx.AsyncClient) -> None:
    """The same flow for a client that needs no events: ``Prefer: wait`` (RFC 7240) on
    ``POST /runs`` answers at the approval, and on the decision at the end."""
    wait = {"Prefer": "wait=50"}  # inside the client's 60 s timeout: a stall shows as the run
    resp = await http.post("/runs", json={"input": QUESTION, "context": EAST}, headers=wait)
    assert resp.status_code == 201, resp.text
    run = resp.json()
    assert run["state"] == "waiting_human", run
    run_id, approval_id = run["run_id"], run["pending_approval"]["approval_id"]
    resp = await http.post(
        f"/runs/{run_id}/approvals/{approval_id}",
        json={"decision": "approve", "comment": "ok"},
        headers={**approver_headers(), **wait},
    )
    assert resp.status_code == 202, resp.text
    run = resp.json()["run"]
    assert run["state"] == "succeeded", run


async def peer_flow(lg: LangGraphClient) -> None:
    thread = await lg.threads.create()
    thread_id = thread["thread_id"]
    await lg.runs.wait(thread_id, PEER_GRAPH, input=PEER_INPUT, raise_error=True)
    result = await lg.runs.wait(
        thread_id,
        PEER_GRAPH,
        command={"resume": {"decision": "approve", "comment": "ok"}},
        raise_error=True,
    )
    assert isinstance(result, dict), result
    assert result["outcome"]["status"] == "succeeded", result.get("outcome")
    assert re.search(r"SKU-\d+", result["result"]["answer"]), result["result"]


@dataclass
class Load:
    flows: int
    wall_s: float
    latencies: list[float]
    cpu_s: float
    """CPU time the server process(es) used during the load."""
    db_cpu_s: float = 0.0
    """CPU time of the PostgreSQL backends of our server's database (0 for the peer)."""

    @property
    def runs_per_s(self) -> float:
        return self.flows / self.wall_s


CpuMeter = Callable[[], float]


def no_cpu() -> float:
    return 0.0


async def load(
    flow: Flow, clients: int, flows_per_client: int, cpu: CpuMeter, db_cpu: CpuMeter = no_cpu
) -> Load:
    latencies: list[float] = []

    async def client() -> None:
        for _ in range(flows_per_client):
            t0 = time.perf_counter()
            await flow()
            latencies.append(time.perf_counter() - t0)

    c0, d0, t0 = cpu(), db_cpu(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall, cpu_s, db_s = time.perf_counter() - t0, cpu() - c0, db_cpu() - d0
    return Load(clients * flows_per_client, wall, latencies, cpu_s, db_s)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class SideResult:
    """One side at one concurrency, over all repetitions."""

    loads: list[Load] = field(default_factory=list)

    @property
    def runs_per_s(self) -> float:
        return median([x.runs_per_s for x in self.loads])

    @property
    def p50(self) -> float:
        """Median over repetitions of each repetition's p50 flow latency."""
        return median([statistics.median(x.latencies) for x in self.loads])

    @property
    def p95(self) -> float:
        return median([pct(x.latencies, 0.95) for x in self.loads])

    @property
    def cpu_per_flow(self) -> float:
        """Median over repetitions of the server's CPU seconds per flow."""
        return median([x.cpu_s / x.flows for x in self.loads])

    @property
    def db_cpu_per_flow(self) -> float:
        return median([x.db_cpu_s / x.flows for x in self.loads])

    @property
    def cpu_share(self) -> float:
        """Median over repetitions of server CPU seconds per wall second (1.0 = one core)."""
        return median([x.cpu_s / x.wall_s for x in self.loads])


OURS_FLOWS: dict[str, Callable[[httpx.AsyncClient], Awaitable[None]]] = {
    "wait": ours_wait_flow,
    "sse": ours_sse_flow,
}
SIDES = ("ours, Prefer: wait", "ours, SSE", "langgraph dev")
PEER = SIDES[-1]


@dataclass
class ThroughputResult:
    clients: int
    sides: dict[str, SideResult]

    def ratio(self, side: str) -> float:
        """Median over repetitions of the side's runs/s ÷ the peer's."""
        peer = self.sides[PEER].loads
        return median(
            [o.runs_per_s / p.runs_per_s for o, p in zip(self.sides[side].loads, peer, strict=True)]
        )

    def rows(self) -> list[list[str]]:
        rows = []
        for name, side in self.sides.items():
            mine = name != PEER
            rows.append(
                [
                    str(self.clients),
                    name,
                    str(len(side.loads)),
                    str(side.loads[0].flows),
                    f"{side.runs_per_s:.1f}",
                    f"{self.ratio(name):.2f}x" if mine else "",
                    f"{side.p50 * 1000:.0f} / {side.p95 * 1000:.0f} ms",
                    f"{side.cpu_per_flow * 1000:.0f} ms",
                    f"{side.db_cpu_per_flow * 1000:.0f} ms" if mine else "",
                    f"{side.cpu_share:.2f}",
                ]
            )
        return rows


HEADER = [
    "clients",
    "side",
    "reps",
    "flows / rep",
    "runs/s (median)",
    "÷ langgraph dev runs/s (median of reps)",
    "flow p50 / p95",
    "server CPU per flow",
    "PostgreSQL CPU per flow",
    "server cores busy",
]


@dataclass
class HttpResult:
    rows: list[ThroughputResult]
    tx_per_flow: float
    """PostgreSQL transactions committed in our server's database per flow."""

    def by_clients(self, n: int) -> ThroughputResult:
        return next(r for r in self.rows if r.clients == n)

    def table(self) -> list[list[str]]:
        return [row for r in self.rows for row in r.rows()]

    def verdicts(self) -> list[tuple[str, str]]:
        r20, r1 = self.by_clients(20), self.by_clients(1)
        out = []
        for side in SIDES[:-1]:
            ratio, p50 = r20.ratio(side), r1.sides[side].p50
            out += [
                (
                    f"{side}: ≥ {TARGET_RATIO:.0f}× langgraph dev runs/s at 20 clients",
                    f"{'met' if ratio >= TARGET_RATIO else 'MISSED'}: {ratio:.2f}x",
                ),
                (
                    f"{side}: p50 of one client's flow < {TARGET_P50_S * 1000:.0f} ms",
                    f"{'met' if p50 < TARGET_P50_S else 'MISSED'}: {p50 * 1000:.0f} ms",
                ),
            ]
        return out


async def _measure(
    ours: Agentrt,
    peer: LanggraphDev,
    db_url: str,
    reps: int,
    flows1: int,
    flows20: int,
    warmup: int,
) -> HttpResult:
    db_cpu = BackendCpu(db_url)
    ours_cpu: CpuMeter = lambda: cpu_seconds(ours.pid)  # noqa: E731
    peer_cpu: CpuMeter = lambda: cpu_seconds(peer.pid, group=True)  # noqa: E731
    async with async_client(ours.base_url) as http:
        lg = get_client(url=peer.url, api_key=None, timeout=120.0)
        try:
            wait_flow: Flow = lambda: ours_wait_flow(http)  # noqa: E731
            sse_flow: Flow = lambda: ours_sse_flow(http)  # noqa: E731
            peer_flow_: Flow = lambda: peer_flow(lg)  # noqa: E731
            sides: list[tuple[str, Flow, CpuMeter, CpuMeter]] = [
                (SIDES[0], wait_flow, ours_cpu, db_cpu),
                (SIDES[1], sse_flow, ours_cpu, db_cpu),
                (PEER, peer_flow_, peer_cpu, no_cpu),
            ]
            for _ in range(warmup):
                for _, flow, _, _ in sides:
                    await flow()
            for _, flow, cpu, _ in sides:  # warm the connection pools at the concurrency used
                await load(flow, 20, 1, cpu)
            await asyncio.sleep(1.5)  # pg_stat_database is flushed about every second
            tx0 = committed(db_url)
            per = {n: {name: SideResult() for name in SIDES} for n in CLIENTS}
            ours_flows = 0
            for i in range(reps):
                for n in CLIENTS:
                    flows = flows1 if n == 1 else flows20
                    # Rotate the order, so no side always runs right after another.
                    for name, flow, cpu, dbc in sides[i % 3 :] + sides[: i % 3]:
                        got = await load(flow, n, flows, cpu, dbc)
                        per[n][name].loads.append(got)
                        ours_flows += got.flows if name != PEER else 0
            await asyncio.sleep(1.5)
            tx = committed(db_url) - tx0
        finally:
            await lg.http.client.aclose()
            db_cpu.close()
    return HttpResult([ThroughputResult(n, per[n]) for n in CLIENTS], tx / ours_flows)


def measure(reps: int = 5, flows1: int = 10, flows20: int = 3, warmup: int = 3) -> HttpResult:
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmpdir, pg_database() as url:
        tmp = Path(tmpdir)
        (tmp / "ours").mkdir()
        (tmp / "peer").mkdir()
        ours = Agentrt(tmp / "ours", url, env={"AGENT_RUNTIME_WORKER_CONCURRENCY": "20"})
        peer = LanggraphDev(tmp / "peer", jobs=20)
        try:
            ours.start(wait=False)
            peer.start()
            ours.wait_started()
            return asyncio.run(_measure(ours, peer, url, reps, flows1, flows20, warmup))
        finally:
            ours.stop()
            peer.stop()


def profile(
    clients: int = 20,
    flows_per_client: int = 5,
    top: int = 35,
    keep: Path | None = None,
    flow_name: str = "wait",
) -> str:
    """cProfile of our server (its main thread: the event loop) under ``clients`` clients."""
    import pstats

    with tempfile.TemporaryDirectory(prefix="bench-http-prof-") as tmpdir, pg_schema() as url:
        tmp = Path(tmpdir)
        ours = Agentrt(
            tmp,
            url,
            env={"AGENT_RUNTIME_WORKER_CONCURRENCY": "20"},
            profile_to=tmp / "server.prof",
        )

        async def drive() -> Load:
            async with async_client(ours.base_url) as http:
                flow: Flow = lambda: OURS_FLOWS[flow_name](http)  # noqa: E731
                await load(flow, clients, 1, lambda: cpu_seconds(ours.pid))
                return await load(flow, clients, flows_per_client, lambda: cpu_seconds(ours.pid))

        try:
            ours.start()
            got = asyncio.run(drive())
        finally:
            ours.stop()  # SIGINT: cProfile writes its file
        out = io.StringIO()
        out.write(
            f"{got.flows} flows, {got.runs_per_s:.1f} runs/s, "
            f"server CPU {got.cpu_s / got.flows * 1000:.0f} ms/flow "
            f"({got.cpu_s / got.wall_s:.2f} cores), including start-up and warm-up below\n"
        )
        if keep is not None:  # for pstats or snakeviz afterwards
            shutil.copy(tmp / "server.prof", keep)
        stats = pstats.Stats(str(tmp / "server.prof"), stream=out)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        # Which run-store methods are called, how often (each is one transaction or more).
        stats.sort_stats("ncalls").print_stats(r"runtime/store/", 30)
        return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--flows1", type=int, default=10, help="flows of the single client")
    parser.add_argument("--flows20", type=int, default=3, help="flows of each of 20 clients")
    parser.add_argument("--quick", action="store_true", help="3 reps, fewer flows")
    parser.add_argument("--profile", action="store_true", help="cProfile our server, 20 clients")
    parser.add_argument("--clients", type=int, default=20, help="with --profile")
    parser.add_argument("--flow", choices=sorted(OURS_FLOWS), default="wait", help="with --profile")
    parser.add_argument("--profile-out", type=Path, help="with --profile: keep the .prof file")
    args = parser.parse_args()
    if args.profile:
        print(profile(clients=args.clients, keep=args.profile_out, flow_name=args.flow))
        return
    if args.quick:
        args.reps, args.flows1, args.flows20 = 3, 5, 2
    result = measure(args.reps, args.flows1, args.flows20)
    print(markdown_table(HEADER, result.table()))
    print(f"PostgreSQL transactions per flow (ours): {result.tx_per_flow:.0f}")
    print(markdown_table(["target", "result"], [list(v) for v in result.verdicts()]))


if __name__ == "__main__":
    main()
