"""Checkpoint size: does a large tool output reach LangGraph's checkpoint?

A tool returning 10 B (the baseline), 1 KB, 1 MB and 10 MB of JSON is run through
the engine; we measure the run's latest checkpoint as stored (SQLite: the
``checkpoints`` row plus ``writes`` of that checkpoint; PostgreSQL: the
``checkpoints`` row, the ``checkpoint_blobs`` it references through
``channel_versions`` and its ``checkpoint_writes``). Outputs over
``runtime.ledger.INLINE_OUTPUT_BYTES`` should become artifacts, so the growth over
the baseline should stay under 2 KB. We also sum every checkpoint of the run's
thread, which shows whether a large value was stored at any step.

``python -m bench.checkpoint_size``
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench import BLOB_AGENT, bench_agents, engine_settings, fmt_bytes, markdown_table, pg_schema
from runtime.ledger import INLINE_OUTPUT_BYTES
from runtime.lifecycle import State
from runtime.model import RunCreate
from server.host import open_host

BASELINE = 10
SIZES = [("1 KB", 1000), ("1 MB", 1000 * 1000), ("10 MB", 10 * 1000 * 1000)]
TARGET_GROWTH = 2048

SQLITE_LATEST = """
SELECT c.checkpoint_id,
       length(c.checkpoint) + length(c.metadata),
       (SELECT coalesce(sum(length(w.value)), 0) FROM writes w
         WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
           AND w.checkpoint_id = c.checkpoint_id)
FROM checkpoints c WHERE c.thread_id = ? AND c.checkpoint_ns = ''
ORDER BY c.checkpoint_id DESC LIMIT 1
"""
SQLITE_THREAD = """
SELECT (SELECT coalesce(sum(length(checkpoint) + length(metadata)), 0)
          FROM checkpoints WHERE thread_id = ?)
     + (SELECT coalesce(sum(length(value)), 0) FROM writes WHERE thread_id = ?)
"""
PG_LATEST = """
SELECT c.checkpoint_id,
       octet_length(c.checkpoint::text) + octet_length(c.metadata::text)
       + (SELECT coalesce(sum(octet_length(bl.blob)), 0)
            FROM jsonb_each_text(c.checkpoint -> 'channel_versions') v
            JOIN checkpoint_blobs bl
              ON bl.thread_id = c.thread_id AND bl.checkpoint_ns = c.checkpoint_ns
             AND bl.channel = v.key AND bl.version = v.value) AS row_bytes,
       (SELECT coalesce(sum(octet_length(w.blob)), 0) FROM checkpoint_writes w
         WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
           AND w.checkpoint_id = c.checkpoint_id) AS write_bytes
FROM checkpoints c WHERE c.thread_id = %s AND c.checkpoint_ns = ''
ORDER BY c.checkpoint_id DESC LIMIT 1
"""
PG_THREAD = """
SELECT (SELECT coalesce(sum(octet_length(checkpoint::text) + octet_length(metadata::text)), 0)
          FROM checkpoints WHERE thread_id = %(t)s)
     + (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_blobs WHERE thread_id = %(t)s)
     + (SELECT coalesce(sum(octet_length(blob)), 0) FROM checkpoint_writes WHERE thread_id = %(t)s)
"""


@dataclass
class Measured:
    latest: int
    """Latest checkpoint: row (+ its blobs) + its pending writes, bytes."""
    thread: int
    """Every checkpoint, blob and write of the run's thread, bytes."""
    artifact: bool


def sqlite_sizes(path: Path, run_id: str) -> tuple[int, int]:
    with sqlite3.connect(path) as conn:
        row = conn.execute(SQLITE_LATEST, (run_id,)).fetchone()
        thread = conn.execute(SQLITE_THREAD, (run_id, run_id)).fetchone()
    return int(row[1]) + int(row[2]), int(thread[0])


def pg_sizes(url: str, run_id: str) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(PG_LATEST, (run_id,)).fetchone()
        thread = conn.execute(PG_THREAD, {"t": run_id}).fetchone()
    assert row is not None and thread is not None
    return int(row[1]) + int(row[2]), int(thread[0])


async def measure_store(store: str) -> dict[int, Measured]:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmpdir:
        tmp = Path(tmpdir)
        if store == "sqlite":
            url = f"sqlite:///{tmp / 'engine.db'}"
            return await _measure(url, tmp, lambda run_id: sqlite_sizes(tmp / "engine.db", run_id))
        with pg_schema() as pg_url:
            return await _measure(pg_url, tmp, lambda run_id: pg_sizes(pg_url, run_id))


async def _measure(
    url: str, tmp: Path, sizes_of: Callable[[str], tuple[int, int]]
) -> dict[int, Measured]:
    out: dict[int, Measured] = {}
    async with open_host(engine_settings(tmp, url), agents=bench_agents()) as host:
        for size in [BASELINE, *(n for _, n in SIZES)]:
            created, _ = await host.engine.create_run(
                RunCreate(agent_id=BLOB_AGENT, input=str(size))
            )
            final = await host.engine.wait_settled(created.run_id, within_s=120)
            assert final.state is State.SUCCEEDED, final
            calls = await host.store.list_tool_calls(created.run_id)
            assert len(calls) == 1 and calls[0].status == "succeeded", calls
            latest, thread = sizes_of(created.run_id)
            out[size] = Measured(latest, thread, calls[0].artifact_id is not None)
    return out


@dataclass
class SizeResult:
    store: str
    label: str
    size: int
    measured: Measured
    baseline: Measured

    @property
    def growth(self) -> int:
        return self.measured.latest - self.baseline.latest

    @property
    def within_target(self) -> bool:
        return self.growth < TARGET_GROWTH

    def row(self) -> list[str]:
        return [
            self.store,
            self.label,
            "artifact" if self.measured.artifact else "inline",
            fmt_bytes(self.baseline.latest),
            fmt_bytes(self.measured.latest),
            f"{self.growth:+d} B",
            f"{self.measured.thread - self.baseline.thread:+d} B",
            "yes" if self.within_target else "NO",
        ]


HEADER = [
    "store",
    "tool output",
    f"output kept as (inline <= {INLINE_OUTPUT_BYTES} B)",
    "latest checkpoint, 10 B output",
    "latest checkpoint",
    "growth",
    "growth, all checkpoints of the run",
    "growth < 2 KB",
]


async def measure(store: str) -> list[SizeResult]:
    m = await measure_store(store)
    return [SizeResult(store, label, n, m[n], m[BASELINE]) for label, n in SIZES]


def main() -> None:
    rows = [r.row() for s in ("sqlite", "postgres") for r in asyncio.run(measure(s))]
    print(markdown_table(HEADER, rows))


if __name__ == "__main__":
    main()
