"""Run every benchmark and print one report: ``python -m bench.run`` (``make bench``).

Options: ``--reps N`` pairs per store for the overhead benchmark (default 25).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sqlite3
import time
from importlib import metadata

import psycopg

from bench import PG_URL, TOOL_STEPS, checkpoint_size, markdown_table, overhead


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=25)
    args = parser.parse_args()
    t0 = time.perf_counter()
    print("## Machine\n")
    print(markdown_table(["", ""], [list(kv) for kv in machine()]))

    print(
        f"\n## Runtime overhead: {TOOL_STEPS} no-op tool steps then finish, "
        f'durability="sync", {args.reps} alternating pairs per store\n',
        flush=True,
    )
    results = [asyncio.run(overhead.measure(s, args.reps)) for s in ("sqlite", "postgres")]
    print(markdown_table(overhead.HEADER, [r.row() for r in results]), flush=True)

    print("\n## Checkpoint size: latest checkpoint of the run vs a 10 B tool output\n")
    sizes = [r for s in ("sqlite", "postgres") for r in asyncio.run(checkpoint_size.measure(s))]
    print(markdown_table(checkpoint_size.HEADER, [r.row() for r in sizes]))

    misses = [f"overhead on {r.store}" for r in results if not r.within_target]
    misses += [f"checkpoint growth {r.store} {r.label}" for r in sizes if not r.within_target]
    print(f"\nTook {time.perf_counter() - t0:.0f} s.", end=" ")
    print("Targets missed: " + ", ".join(misses) if misses else "All targets met.")


if __name__ == "__main__":
    main()
