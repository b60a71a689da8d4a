"""Run every benchmark and print one report: ``python -m bench.run`` (``make bench``).

Options: ``--reps N`` pairs per store for the overhead benchmark (default 25);
``--quick`` (or ``BENCH_QUICK=1`` in the environment) for fewer repetitions and
2,000 instead of 10,000 parked runs; ``--only NAME`` (repeatable) to run some of
overhead, checkpoint_size, http, sse, parked, takeover, backlog.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import time
from importlib import metadata
from pathlib import Path

import psycopg

from bench import (
    PG_URL,
    TOOL_STEPS,
    backlog,
    checkpoint_size,
    http_throughput,
    markdown_table,
    overhead,
    parked,
    sse_latency,
    takeover,
)

PARTS = ("overhead", "checkpoint_size", "http", "sse", "parked", "takeover", "backlog")


def machine() -> list[tuple[str, str]]:
    mem_kib = 0
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
    except OSError:
        pass
    try:
        with psycopg.connect(PG_URL, connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        pg = str(row[0]) if row else "?"
    except psycopg.OperationalError as exc:
        pg = f"unreachable ({exc})"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        ("CPUs (nproc)", str(cpus)),
        ("CPU", platform.processor() or platform.machine()),
        ("memory", f"{mem_kib / 1024 / 1024:.1f} GiB" if mem_kib else "?"),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
        ("PostgreSQL", pg),
        ("SQLite", sqlite3.sqlite_version),
        ("langgraph", metadata.version("langgraph")),
        ("langgraph-checkpoint-sqlite", metadata.version("langgraph-checkpoint-sqlite")),
        ("langgraph-checkpoint-postgres", metadata.version("langgraph-checkpoint-postgres")),
    ]


def load_line() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")))
    parser.add_argument("--only", action="append", choices=PARTS)
    args = parser.parse_args()
    quick = args.quick
    reps = args.reps if args.reps is not None else (10 if quick else 25)
    parts = set(args.only or PARTS)
    t0 = time.perf_counter()
    misses: list[str] = []
    print("## Machine\n")
    print(markdown_table(["", ""], [list(kv) for kv in machine()]))
    print(f"\nLoad average at start: {load_line()}{' (quick run)' if quick else ''}")

    if "overhead" in parts:
        print(
            f"\n## Runtime overhead: {TOOL_STEPS} no-op tool steps then finish, "
            f'durability="sync", {reps} alternating pairs per store\n',
            flush=True,
        )
        results = [asyncio.run(overhead.measure(s, reps)) for s in ("sqlite", "postgres")]
        # Context, not a target: the same runs when planning and tools take some time.
        real_reps = max(3, reps // 3)
        realistic = [
            asyncio.run(overhead.measure(s, real_reps, work=overhead.REALISTIC))
            for s in ("sqlite", "postgres")
        ]
        rows = [r.row() for r in results + realistic]
        print(markdown_table(overhead.HEADER, rows), flush=True)
        misses += [f"overhead on {r.store}" for r in results if not r.within_target]

    if "checkpoint_size" in parts:
        print("\n## Checkpoint size: latest checkpoint of the run vs a 10 B tool output\n")
        sizes = [r for s in ("sqlite", "postgres") for r in asyncio.run(checkpoint_size.measure(s))]
        print(markdown_table(checkpoint_size.HEADER, [r.row() for r in sizes]), flush=True)
        misses += [f"checkpoint growth {r.store} {r.label}" for r in sizes if not r.within_target]

    if "http" in parts:
        h_reps, flows1, flows20 = (3, 5, 2) if quick else (5, 6, 3)
        print(
            "\n## HTTP: demo flow (create → waiting_human → approve → succeeded), "
            f"ours on PostgreSQL vs langgraph dev, {h_reps} alternating repetitions\n",
            flush=True,
        )
        http = http_throughput.measure(h_reps, flows1, flows20)
        print(markdown_table(http_throughput.HEADER, http.table()))
        print(f"\nPostgreSQL transactions per flow (ours): {http.tx_per_flow:.0f}\n")
        print(markdown_table(["target", "result"], [list(v) for v in http.verdicts()]), flush=True)
        misses += [t for t, v in http.verdicts() if not v.startswith("met")]

    if "sse" in parts:
        s_reps, s_flows = (3, 3) if quick else (5, 6)
        print(
            "\n## SSE latency: an event's write → its frame at the client, live events of "
            f"the demo flow, {s_reps} alternating repetitions (context, no target)\n",
            flush=True,
        )
        sse = sse_latency.measure(s_reps, s_flows)
        print(markdown_table(sse_latency.HEADER, sse.rows()))
        print(f"\nAcross processes / in one (p50, 1 client): {sse.crossing():.2f}x", flush=True)

    if "parked" in parts:
        n, sample = (2_000, 20) if quick else (10_000, 30)
        print(f"\n## Parked runs: {n:,} runs in waiting_human in one server\n", flush=True)
        park = parked.measure(n, sample)
        print(markdown_table(parked.HEADER, park.rows()))
        print()
        print(markdown_table(parked.LATENCY_HEADER, park.latency_rows()), flush=True)
        if not park.within_target:
            misses.append("parked run memory")

    if "takeover" in parts:
        t_reps = 3 if quick else 5
        print(
            f"\n## Takeover: worker holding {takeover.RUNS} running runs SIGKILLed, "
            f"{t_reps} repetitions\n",
            flush=True,
        )
        tk = takeover.measure(t_reps)
        print(markdown_table(takeover.HEADER, [tk.row()]), flush=True)
        if not tk.within_target:
            misses.append("takeover time")

    if "backlog" in parts:
        large = 20_000 if quick else backlog.LARGE
        print(
            f"\n## Large tables: median of {backlog.CLAIMS} claims of one run, "
            "and of 10 reads of each page (context, no target)\n",
            flush=True,
        )
        print(markdown_table(backlog.HEADER, [r.row() for r in backlog.measure(large)]))
        print()
        print(markdown_table(backlog.READS_HEADER, backlog.reads(large)), flush=True)

    print(f"\nLoad average at end: {load_line()}")
    print(f"Took {time.perf_counter() - t0:.0f} s.", end=" ")
    print("Targets missed: " + ", ".join(misses) if misses else "All targets met.")


if __name__ == "__main__":
    main()
