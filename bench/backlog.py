"""Large tables: does a claim, or a page of runs, read the rows behind it?

The runs are copies of one run created through the store, inserted by one SQL
statement (creating 100,000 through the engine would take minutes and measure
creation); no ``ANALYZE`` or ``VACUUM`` follows: the statistics a burst of the last
minute leaves. Each figure is a median, small and large tables measured one after the
other in the same process.

* **Claims.** A worker claims each time a slot frees (``claim_runs(limit=1)``, for
  the one agent it hosts, as workers do): 30 claims of one run each against a backlog
  of waiting runs of 1, 100, and many tenants, and of another agent (no worker has it)
  in the same tenant as 100 runs of the worker's. A claim reads each tenant's first
  ``limit`` + 16 waiting runs of each agent the worker hosts while few tenants have
  runs waiting (``runtime.store.leases.FEW_TENANTS``), every waiting run past that.
* **Reads.** One tenant with 1,000 and with 100,000 ended runs (10 of them waiting
  for a human, with a pending approval each; 10 of another agent): the pages the API
  serves (``GET /runs`` by tenant, state, agent, a page deep in the list; the
  approvals inbox), 10 of each.

``python -m bench.backlog [--large N]``
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench import markdown_table, pg_schema
from runtime.backend import open_backend
from runtime.model import Run
from runtime.store.base import RunStore
from tests.unit.conftest import build_run

LARGE = 100_000
CLAIMS = 30


IN_FLIGHT = 400
"""Tenants with one run each under a live lease, in one case: more than
``runtime.store.leases.FEW_TENANTS``, as in a busy fleet."""


HOSTED = "test-agent"
"""The agent of the template run, the one the claiming worker hosts."""

OURS_BESIDE = 100
"""Runs of the worker's agent behind another agent's backlog, in that case."""


def cases(large: int) -> list[tuple[int, int, int, bool]]:
    """(tenants, waiting runs, runs in flight, of another agent): the baseline first,
    then a large backlog of one tenant, of a hundred, of one beside 400 tenants being
    served, of so many tenants that each has a few runs, and of another agent ahead
    of :data:`OURS_BESIDE` runs of the worker's in one tenant."""
    return [
        (1, 100, 0, False),
        (1, large, 0, False),
        (100, large, 0, False),
        (1, large, IN_FLIGHT, False),
        (large // 5, large, 0, False),
        (1, large, 0, True),
    ]


HEADER = [
    "store",
    "tenants waiting",
    "waiting runs",
    "tenants in flight",
    "of another agent",
    "claim (median)",
    "÷ 100 runs of one tenant",
]
READS_SMALL = 1_000
RARE = 10
READS_HEADER = ["store", "read", f"{READS_SMALL:,} runs", "large table", "large ÷ small"]


@dataclass
class Result:
    store: str
    tenants: int
    waiting: int
    in_flight: int
    foreign: bool
    claim_s: float
    baseline_s: float

    def row(self) -> list[str]:
        return [
            self.store,
            f"{self.tenants:,}",
            f"{self.waiting:,}",
            f"{self.in_flight:,}",
            "yes" if self.foreign else "no",
            f"{self.claim_s * 1000:.2f} ms",
            f"{self.claim_s / self.baseline_s:.2f}x",
        ]


def template_run() -> Run:
    """A pending run as the engine builds it (the unit tests' builder), under a fixed id."""
    return build_run(tenant_id="t0").model_copy(update={"run_id": "bench-template"})


def copy_sql(columns: list[str], count: int, tenants: int, dialect: str, prefix: str) -> str:
    """Copies of the template run: ids ``<prefix>b<n>``, tenants ``<prefix>t<n %
    tenants>``, in id order among runs of equal age."""
    text = "::text" if dialect == "postgres" else ""
    pick = {
        "run_id": f"'{prefix}b' || lpad(g{text}, 7, '0')",
        "tenant_id": f"'{prefix}t' || (g % {tenants}){text}",
    }
    select = ", ".join(pick.get(col, col) for col in columns)
    series = (
        f"generate_series(1, {count}) AS g"
        if dialect == "postgres"
        else f"(WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < {count}) "
        "SELECT g FROM s)"
    )
    return (
        f"INSERT INTO runs ({', '.join(columns)}) SELECT {select} FROM runs, {series} "
        "WHERE run_id = 'bench-template'"
    )


def fill(target: str, dialect: str, count: int, tenants: int, prefix: str = "") -> None:
    if dialect == "postgres":
        with psycopg.connect(target, autocommit=True) as conn:
            cols = [
                str(r[0])
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs' "
                    "AND table_schema = current_schema() ORDER BY ordinal_position"
                )
            ]
            conn.execute(copy_sql(cols, count, tenants, dialect, prefix))
        return
    db = sqlite3.connect(target)
    try:
        cols = [str(r[1]) for r in db.execute("PRAGMA table_info(runs)")]
        # SQLite has no lpad.
        sql = copy_sql(cols, count, tenants, dialect, prefix).replace(
            "lpad(g, 7, '0')", "substr('0000000' || g, -7)"
        )
        db.execute(sql)
        db.commit()
    finally:
        db.close()


async def claim_time(store: RunStore) -> float:
    times = []
    for i in range(CLAIMS):
        start = time.perf_counter()
        claimed = await store.claim_runs(f"bench-w{i}", 1, 600.0, agents={HOSTED})
        times.append(time.perf_counter() - start)
        assert len(claimed) == 1, claimed
    return statistics.median(times)


def run_sql(target: str, dialect: str, statements: list[str]) -> None:
    if dialect == "postgres":
        with psycopg.connect(target, autocommit=True) as conn:
            for sql in statements:
                conn.execute(sql)
        return
    db = sqlite3.connect(target)
    try:
        for sql in statements:
            db.execute(sql)
        db.commit()
    finally:
        db.close()


async def backlog_claim(
    url: str, fill_target: str, dialect: str, case: tuple[int, int, int, bool]
) -> float:
    tenants, count, in_flight, foreign = case
    backend = await open_backend(url)
    try:
        store = backend.store
        await store.create_run(template_run(), "hash")
        fill(fill_target, dialect, count, tenants)
        if foreign:  # ahead of the worker's own: as old, first in id order, same tenant
            mine = "run_id = 'bench-template' OR run_id LIKE 'hb%'"
            run_sql(
                fill_target, dialect, [f"UPDATE runs SET agent_id = 'elsewhere' WHERE NOT ({mine})"]
            )
            fill(fill_target, dialect, OURS_BESIDE, 1, prefix="h")
            run_sql(fill_target, dialect, [f"UPDATE runs SET tenant_id = 't0' WHERE {mine}"])
        if in_flight:
            fill(fill_target, dialect, in_flight, in_flight, prefix="f")
            run_sql(
                fill_target,
                dialect,
                [
                    "UPDATE runs SET lease_owner = 'bench-busy', "
                    f"lease_expires_at = {store.now_sql} + 3600 WHERE run_id LIKE 'fb%'"
                ],
            )
        return await claim_time(store)
    finally:
        await backend.close()


def measure_store(dialect: str, large: int) -> list[Result]:
    timed: list[tuple[tuple[int, int, int, bool], float]] = []
    for case in cases(large):
        if dialect == "postgres":
            with pg_schema() as url:
                claim = asyncio.run(backlog_claim(url, url, dialect, case))
        else:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "claims.db"
                claim = asyncio.run(backlog_claim(f"sqlite:///{path}", str(path), dialect, case))
        timed.append((case, claim))
    baseline = timed[0][1]
    return [Result(dialect, *case, claim, baseline) for case, claim in timed]


def measure(large: int = LARGE) -> list[Result]:
    return [r for s in ("sqlite", "postgres") for r in measure_store(s, large)]


def mark_ended(target: str, dialect: str) -> None:
    """All runs succeeded but the first ``RARE`` (waiting for a human, an approval
    pending each) and the last ``RARE`` (another agent); one approval per run."""
    run_sql(
        target,
        dialect,
        [
            "UPDATE runs SET state = 'succeeded', needs_drive = 0",
            "UPDATE runs SET state = 'waiting_human' WHERE run_id IN "
            f"(SELECT run_id FROM runs ORDER BY run_id LIMIT {RARE})",
            "UPDATE runs SET agent_id = 'rare' WHERE run_id IN "
            f"(SELECT run_id FROM runs ORDER BY run_id DESC LIMIT {RARE})",
            "INSERT INTO approvals (approval_id, run_id, tool_call_id, tool, args, args_hash, "
            "risk, reason, status, created_at) SELECT 'ap-' || run_id, run_id, 'tc', 'refund', "
            "'{}', 'h', 'high', 'r', CASE WHEN state = 'waiting_human' THEN 'pending' "
            "ELSE 'approved' END, created_at FROM runs",
        ],
    )


async def median_of(read: Callable[[], Awaitable[object]], times: int = 10) -> float:
    taken = []
    for _ in range(times):
        start = time.perf_counter()
        await read()
        taken.append(time.perf_counter() - start)
    return statistics.median(taken)


async def read_times(url: str, target: str, dialect: str, count: int) -> dict[str, float]:
    backend = await open_backend(url)
    try:
        store = backend.store
        await store.create_run(template_run(), "hash")
        fill(target, dialect, count - 1, 1)
        mark_ended(target, dialect)
        _, deep = await store.list_runs(tenant_id="t0", states=["succeeded"], limit=count // 2)
        reads: dict[str, Callable[[], Awaitable[object]]] = {
            "runs of the tenant, first page": lambda: store.list_runs(tenant_id="t0"),
            f"runs waiting for a human ({RARE})": lambda: store.list_runs(
                tenant_id="t0", states=["waiting_human"]
            ),
            "runs succeeded, first page": lambda: store.list_runs(
                tenant_id="t0", states=["succeeded"]
            ),
            "runs succeeded, a page halfway": lambda: store.list_runs(
                tenant_id="t0", states=["succeeded"], cursor=deep
            ),
            f"runs of another agent ({RARE})": lambda: store.list_runs(
                tenant_id="t0", agent_ids=["rare"]
            ),
            f"approvals pending ({RARE})": lambda: store.list_approvals(
                tenant_id="t0", status="pending"
            ),
        }
        return {name: await median_of(read) for name, read in reads.items()}
    finally:
        await backend.close()


def reads(large: int = LARGE) -> list[list[str]]:
    rows: list[list[str]] = []
    for dialect in ("sqlite", "postgres"):
        timed = []
        for count in (READS_SMALL, large):
            if dialect == "postgres":
                with pg_schema() as url:
                    timed.append(asyncio.run(read_times(url, url, dialect, count)))
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "reads.db"
                    timed.append(
                        asyncio.run(read_times(f"sqlite:///{path}", str(path), dialect, count))
                    )
        small, big = timed
        rows += [
            [
                dialect,
                name,
                f"{small[name] * 1000:.2f} ms",
                f"{big[name] * 1000:.2f} ms ({large:,} runs)",
                f"{big[name] / small[name]:.2f}x",
            ]
            for name in small
        ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", type=int, default=LARGE)
    args = parser.parse_args()
    print(markdown_table(HEADER, [r.row() for r in measure(args.large)]))
    print()
    print(markdown_table(READS_HEADER, reads(args.large)))


if __name__ == "__main__":
    main()
