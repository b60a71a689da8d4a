"""Parked runs: does a run waiting for a human cost the server memory, and slow approvals?

``agent-runtime serve`` (HTTP + its worker) on a fresh PostgreSQL schema with the
``bench_park`` agent (bench/agents.py: one high-risk call, so a run parks in
``waiting_human`` after one planning step; approved, it runs the call and finishes).

1. Warm up: ``--warmup`` runs parked and approved to the end.
2. Baseline: approve-to-succeeded latency of ``--sample`` parked runs, one at a
   time (``POST /runs/{id}/approvals/{ap}`` then SSE until ``state → succeeded``),
   while almost nothing else is parked.
3. Server RSS (``VmRSS`` of /proc/<pid>/status) once it is stable ("before").
4. ``--runs`` runs created through HTTP (bounded concurrency); wait until every one
   is ``waiting_human`` (counted in the database); RSS once stable again ("after").
   Per parked run = (after − before) / N.
5. Approve-to-succeeded latency of ``--sample`` of those runs, one at a time, while
   the others wait; compared with step 2 in the same session.

Target (issue #6): under 5 KB of server memory per parked run.

``python -m bench.parked [--runs N] [--quick]``
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from bench import fmt_bytes, markdown_table, pg_schema
from bench._http import approver_headers, async_client, follow, state_is
from bench._proc import Agentrt, rss_bytes
from bench.agents import EXTRA_AGENTS, PARK_AGENT

TARGET_PER_RUN = 5 * 1024
CREATE_CONCURRENCY = 32


async def create_parked(
    http: httpx.AsyncClient, n: int, limit: int = CREATE_CONCURRENCY
) -> list[str]:
    sem = asyncio.Semaphore(limit)

    async def one() -> str:
        async with sem:
            resp = await http.post("/runs", json={"agent_id": PARK_AGENT, "input": "park"})
            assert resp.status_code == 201, resp.text
            run_id: str = resp.json()["run_id"]
            return run_id

    return list(await asyncio.gather(*(one() for _ in range(n))))


def count_waiting(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM runs WHERE state = 'waiting_human'").fetchone()
    return int(row[0]) if row else 0


async def wait_parked(url: str, n: int, within_s: float, check: Callable[[], None]) -> float:
    """Wait until ``n`` runs are waiting_human; returns when (perf_counter)."""
    deadline = time.monotonic() + within_s
    while True:
        check()
        if await asyncio.to_thread(count_waiting, url) >= n:
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {count_waiting(url)} of {n} runs parked after {within_s}s")
        await asyncio.sleep(0.5)


async def stable_rss(pid: int, settle_s: float = 3.0, most_s: float = 60.0) -> int:
    """RSS once it changed by < 1 % over ``settle_s`` (sampled every 0.5 s); the median then."""
    window = max(2, int(settle_s / 0.5))
    samples: list[int] = []
    deadline = time.monotonic() + most_s
    while True:
        samples.append(rss_bytes(pid))
        recent = samples[-window:]
        if len(recent) == window and (max(recent) - min(recent)) < 0.01 * max(recent):
            return int(statistics.median(recent))
        if time.monotonic() > deadline:
            return int(statistics.median(recent))
        await asyncio.sleep(0.5)


async def approve_latency(http: httpx.AsyncClient, run_id: str) -> float:
    run = (await http.get(f"/runs/{run_id}")).json()
    assert run["state"] == "waiting_human", run
    approval_id = run["pending_approval"]["approval_id"]
    t0 = time.perf_counter()
    resp = await http.post(
        f"/runs/{run_id}/approvals/{approval_id}",
        json={"decision": "approve"},
        headers=approver_headers(),
    )
    assert resp.status_code == 202, resp.text
    events = await follow(http, run_id, state_is("succeeded", "failed"))
    elapsed = time.perf_counter() - t0
    assert events[-1]["data"]["to"] == "succeeded", events[-3:]
    return elapsed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class ParkedResult:
    runs: int
    create_s: float
    rss_before: int
    rss_after: int
    baseline: list[float]
    loaded: list[float]

    @property
    def per_run(self) -> float:
        return (self.rss_after - self.rss_before) / self.runs

    @property
    def within_target(self) -> bool:
        return self.per_run < TARGET_PER_RUN

    def rows(self) -> list[list[str]]:
        return [
            [
                str(self.runs),
                f"{self.runs / self.create_s:.0f} runs/s",
                fmt_bytes(self.rss_before),
                fmt_bytes(self.rss_after),
                f"{self.per_run:.0f} B",
                "yes" if self.within_target else "NO",
            ]
        ]

    def latency_rows(self) -> list[list[str]]:
        def row(label: str, xs: list[float]) -> list[str]:
            return [
                label,
                str(len(xs)),
                f"{statistics.median(xs) * 1000:.0f} ms",
                f"{pct(xs, 0.95) * 1000:.0f} ms",
            ]

        ratio = statistics.median(self.loaded) / statistics.median(self.baseline)
        return [
            row("~0 other runs parked", self.baseline),
            row(f"{self.runs} other runs parked", self.loaded),
            ["ratio of p50s", "", f"{ratio:.2f}x", ""],
        ]


HEADER = [
    "parked runs",
    "created and parked at",
    "server RSS before",
    "server RSS with them parked",
    "per parked run",
    "< 5 KB",
]
LATENCY_HEADER = ["approve → succeeded, one at a time", "runs", "p50", "p95"]


async def _measure(server: Agentrt, url: str, runs: int, sample: int, warmup: int) -> ParkedResult:
    def alive() -> None:
        assert server.proc is not None and server.proc.poll() is None, server.log_text()[-2000:]

    async with async_client(server.base_url, connections=CREATE_CONCURRENCY + 4) as http:
        # 1. warm up: park and approve a few runs end to end
        warm = await create_parked(http, warmup)
        await wait_parked(url, warmup, 120, alive)
        for run_id in warm:
            await approve_latency(http, run_id)
        # 2. baseline latency with (almost) nothing parked
        few = await create_parked(http, sample)
        await wait_parked(url, sample, 120, alive)
        baseline = [await approve_latency(http, run_id) for run_id in few]
        # 3. RSS before
        before = await stable_rss(server.pid)
        # 4. park N runs
        t0 = time.perf_counter()
        parked = await create_parked(http, runs)
        t1 = await wait_parked(url, runs, 1800, alive)
        after = await stable_rss(server.pid)
        # 5. approvals while they wait
        picked = random.Random(6).sample(parked, sample)
        loaded = [await approve_latency(http, run_id) for run_id in picked]
    return ParkedResult(runs, t1 - t0, before, after, baseline, loaded)


def measure(runs: int = 10_000, sample: int = 30, warmup: int = 20) -> ParkedResult:
    with tempfile.TemporaryDirectory(prefix="bench-parked-") as tmpdir, pg_schema() as url:
        server = Agentrt(
            Path(tmpdir),
            url,
            env={
                "AGENT_RUNTIME_EXTRA_AGENTS": EXTRA_AGENTS,
                "AGENT_RUNTIME_WORKER_CONCURRENCY": "20",
            },
        )
        try:
            server.start()
            return asyncio.run(_measure(server, url, runs, sample, warmup))
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--sample", type=int, default=30, help="approvals timed, each phase")
    parser.add_argument("--quick", action="store_true", help="2,000 runs, 20 approvals timed")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.sample = 2_000, 20
    result = measure(args.runs, args.sample)
    print(markdown_table(HEADER, result.rows()))
    print(markdown_table(LATENCY_HEADER, result.latency_rows()))


if __name__ == "__main__":
    main()
