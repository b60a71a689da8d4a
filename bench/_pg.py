"""A fresh PostgreSQL database per benchmark, and what PostgreSQL did for it.

A database of its own (not only a schema) lets ``pg_stat_database`` count the
benchmark's transactions and ``pg_stat_activity`` name its backends, whose CPU
time we read from /proc, even while other clients use the same cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench import PG_URL
from bench._proc import cpu_seconds


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextmanager
def pg_database(base: str = PG_URL) -> Iterator[str]:
    """The URL of a fresh database on the same cluster, dropped afterwards."""
    name = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield _with_db(base, name)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def committed(url: str) -> int:
    """Transactions committed in the URL's database (pg_stat_database, flushed within ~1 s)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


class BackendCpu:
    """CPU seconds of the PostgreSQL backends serving one database (same host only).

    Cumulative over every backend seen so far: a backend that exits keeps the CPU
    last read for it, so the total never goes down (it undercounts the CPU a
    backend used between the last reading and its exit).
    """

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.seen: dict[int, float] = {}

    def __call__(self) -> float:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
        for (pid,) in rows:
            used = cpu_seconds(int(pid))
            if used:
                self.seen[int(pid)] = max(used, self.seen.get(int(pid), 0.0))
        return sum(self.seen.values())

    def close(self) -> None:
        self.conn.close()
